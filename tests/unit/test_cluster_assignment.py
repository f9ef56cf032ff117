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


def test_a_pinned_partition_goes_to_its_live_target_and_is_never_balanced_away() -> None:
    current = {1: Leader(1, 4), 2: Leader(1, 2), 3: Leader(2, 3), 4: Leader(3, 1)}
    changes = assign([1, 2, 3], current, {1: 3})
    assert changes[1] == Leader(3, 5)  # moved to its target, next epoch
    after_pin = after(current, changes)
    assert sorted(loads(after_pin).values()) == [1, 1, 2]
    assert assign([1, 2, 3], after_pin, {1: 3}) == {}  # stable
    # a pin that is not yet honoured by balance: all four pinned to 3 stay there
    all_on_3 = {sid: Leader(3, 1) for sid in range(1, 5)}
    assert assign([1, 2, 3], all_on_3, dict.fromkeys(range(1, 5), 3)) == {}
    # balance moves the unpinned ones only
    mixed = {1: Leader(3, 1), 2: Leader(3, 1), 3: Leader(3, 1), 4: Leader(3, 1)}
    moved = assign([1, 2, 3], mixed, {1: 3, 2: 3})
    assert set(moved) == {3, 4} and {c.node_id for c in moved.values()} == {1, 2}


def test_a_pin_to_a_dead_broker_is_ignored_until_it_is_live_again() -> None:
    current = {1: Leader(3, 4), 2: Leader(1, 1)}
    away = assign([1, 2], current, {1: 3})  # 3 died: its partition goes elsewhere
    assert away[1].node_id in (1, 2) and away[1].epoch == 5
    moved = after(current, away)
    back = assign([1, 2, 3], moved, {1: 3})  # 3 is back: the partition returns to it
    assert back[1] == Leader(3, 6)
