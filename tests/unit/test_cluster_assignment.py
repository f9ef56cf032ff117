"""The controller's placement rule (broker.cluster.assignment.assign), a pure function: live
brokers + current leaders -> the partitions whose leader changes, each with the next epoch."""

from __future__ import annotations

from collections import Counter

from broker.cluster.assignment import assign
from broker.cluster.model import NO_LEADER, Leader


def after(current: dict[int, Leader], changes: dict[int, Leader]) -> dict[int, Leader]:
    return {**current, **changes}


def loads(leaders: dict[int, Leader]) -> Counter[int]:
    return Counter(lead.node_id for lead in leaders.values())


def test_new_partitions_are_spread_evenly_with_the_next_epoch() -> None:
    current = {sid: Leader(NO_LEADER, 0) for sid in range(1, 8)}
    changes = assign([1, 2, 3], current)
    assert set(changes) == set(current)
    assert all(c.epoch == 1 for c in changes.values())
    assert sorted(loads(changes).values()) == [2, 2, 3]


def test_a_dead_brokers_partitions_go_to_the_live_ones_and_nothing_else_moves() -> None:
    current = {1: Leader(1, 4), 2: Leader(2, 7), 3: Leader(3, 1), 4: Leader(1, 2),
               5: Leader(2, 3), 6: Leader(3, 9)}
    changes = assign([1, 2], current)  # 3 died
    assert set(changes) == {3, 6}
    assert changes[3].epoch == 2 and changes[6].epoch == 10
    assert sorted(loads(after(current, changes)).values()) == [3, 3]


def test_a_new_broker_gets_its_share_moved_to_it() -> None:
    current = {sid: Leader(1, 5) for sid in range(1, 7)}
    changes = assign([1, 2, 3], current)
    assert loads(after(current, changes)) == Counter({1: 2, 2: 2, 3: 2})
    assert len(changes) == 4 and all(c.epoch == 6 for c in changes.values())


def test_a_balanced_assignment_is_left_alone() -> None:
    current = {1: Leader(1, 3), 2: Leader(2, 3), 3: Leader(1, 3)}
    assert assign([1, 2], current) == {}
    assert assign([], current) == {}  # nobody alive: nothing to hand out


def test_a_released_partition_goes_to_the_least_loaded_broker() -> None:
    current = {1: Leader(1, 0), 2: Leader(1, 0), 3: Leader(2, 0), 4: Leader(NO_LEADER, 6)}
    assert assign([1, 2], current) == {4: Leader(2, 7)}
