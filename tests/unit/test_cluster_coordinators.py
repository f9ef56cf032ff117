"""Group coordinator placement (broker.cluster.coordinators): every broker computes the same
coordinator from the same live brokers; a broker's death moves only its own slots; a group
that moved away is unloaded (its waiting members told NOT_COORDINATOR)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from broker.cluster.coordinators import (
    COORDINATOR_SLOTS,
    coordinator_of,
    drop_moved,
    ensure_loaded,
    is_local,
    slot_owner,
    slot_table,
)
from broker.cluster.model import NO_LEADER, BrokerInfo, ClusterView
from broker.errors import ErrorCode, KafkaError
from broker.groups.coordinator import GroupCoordinator


def view(*nodes: int) -> ClusterView:
    return ClusterView(brokers=tuple(BrokerInfo(n, "127.0.0.1", 9000 + n, None) for n in nodes))


ME = BrokerInfo(1, "127.0.0.1", 9001, None)


def test_every_broker_names_the_same_coordinator_whatever_its_view_order() -> None:
    a = ClusterView(brokers=tuple(reversed(view(1, 2, 3).brokers)))
    for g in (f"group-{i}" for i in range(200)):
        assert coordinator_of(g, view(1, 2, 3), ME) == coordinator_of(g, a, ME)
    assert coordinator_of("g", None, ME) == ME  # no cluster: the broker asked
    assert coordinator_of("g", ClusterView(), ME) == ME  # not advertised yet
    assert slot_owner(3, []) == NO_LEADER


def test_slots_are_spread_and_only_a_dead_brokers_slots_move() -> None:
    before = slot_table(view(1, 2, 3))
    assert len(before) == COORDINATOR_SLOTS
    assert min(Counter(before.values()).values()) >= COORDINATOR_SLOTS // 6
    after = slot_table(view(1, 3))
    moved = {s for s in before if before[s] != after[s]}
    assert moved == {s for s, n in before.items() if n == 2}
    assert set(after.values()) == {1, 3}
    joined = slot_table(view(1, 2, 3, 4))
    assert all(joined[s] in (before[s], 4) for s in before)  # a newcomer only takes slots


async def test_a_moved_group_is_unloaded_and_reloaded_when_it_comes_back() -> None:
    groups = GroupCoordinator(initial_delay_s=5.0)
    groups.start()
    try:
        gid = next(g for g in (f"g{i}" for i in range(100))
                   if is_local(g, view(1, 2), 1) and not is_local(g, view(2), 1))
        both, alone = view(1, 2), view(2)
        assert drop_moved(groups, both, 1) == []
        loads: list[str] = []

        async def load() -> None:
            loads.append(gid)
            await asyncio.sleep(0.05)

        await asyncio.gather(*(ensure_loaded(groups, gid, load) for _ in range(3)))
        await ensure_loaded(groups, gid, load)
        assert loads == [gid]  # one load, the requests arriving meanwhile waited for it
        join = asyncio.create_task(groups.join(gid, "", None, "c", "h", 10.0, 10.0,
                                               "consumer", [("range", b"")],
                                               require_known_member_id=False))
        await asyncio.sleep(0.1)  # waiting for the join phase (5 s initial delay)
        assert gid in groups.groups
        assert drop_moved(groups, alone, 1) == [gid]
        with pytest.raises(KafkaError) as e:
            await asyncio.wait_for(join, 2.0)
        assert e.value.code == ErrorCode.not_coordinator
        assert gid not in groups.groups
        assert drop_moved(groups, alone, 1) == []  # once per view
        assert drop_moved(groups, view(1, 2), 1) == []
        await ensure_loaded(groups, gid, load)  # it was away: offsets are read again
        assert loads == [gid, gid]
    finally:
        await groups.stop()
