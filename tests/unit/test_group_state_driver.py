"""The coordinator's driver (broker/groups/coordinator.py) over the real event loop: waiting
JoinGroup / SyncGroup requests answered from the transitions' effects, the join-phase timer
(the session reaper is not started here, so only the timer can end a join phase), and a
cancelled request abandoned."""

from __future__ import annotations

import asyncio

import pytest

from broker.errors import ErrorCode, KafkaError
from broker.groups.coordinator import GroupCoordinator, JoinResult

PROTOCOLS = [("range", b"meta")]


def join(c: GroupCoordinator, member_id: str = "") -> asyncio.Future[JoinResult]:
    """A JoinGroup under way (rebalance timeout 0.3 s)."""
    return asyncio.ensure_future(
        c.join("g", member_id, None, "client", "h", 10.0, 0.3, "consumer", PROTOCOLS, False)
    )


async def test_joins_syncs_and_the_join_phase_timer() -> None:
    c = GroupCoordinator(initial_delay_s=0.05, min_session_s=1.0)
    try:
        ra, rb = await asyncio.wait_for(asyncio.gather(join(c), join(c)), 5)
        assert ra.generation == rb.generation == 1
        assert ra.leader == rb.leader == ra.member_id
        leader, follower = ra.member_id, rb.member_id
        waiting = asyncio.ensure_future(c.sync("g", 1, follower, None, {}))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        answer = await asyncio.wait_for(
            c.sync("g", 1, leader, None, {leader: b"L", follower: b"F"}), 1
        )
        assert answer == (b"L", "consumer", "range")
        assert await asyncio.wait_for(waiting, 1) == (b"F", "consumer", "range")
        # the leader rejoins, the follower never does: the rebalance timeout ends the phase
        again = await asyncio.wait_for(join(c, leader), 5)
        assert (again.generation, [m for m, _i, _md in again.members]) == (2, [leader])
        with pytest.raises(KafkaError) as e:
            c.heartbeat("g", 2, follower, None)
        assert e.value.code == ErrorCode.unknown_member_id
    finally:
        await c.stop()


async def test_a_cancelled_join_no_longer_counts_as_rejoined() -> None:
    c = GroupCoordinator(initial_delay_s=0.05, min_session_s=1.0)
    try:
        a, b = await asyncio.wait_for(asyncio.gather(join(c), join(c)), 5)
        assignments = {a.member_id: b"", b.member_id: b""}
        await asyncio.wait_for(c.sync("g", 1, a.member_id, None, assignments), 1)
        rejoin = join(c, a.member_id)  # the leader: a rebalance, waiting for b
        await asyncio.sleep(0.01)
        member = c.groups["g"].members[a.member_id]
        assert member.join_ticket is not None
        rejoin.cancel()  # its connection closed
        await asyncio.sleep(0.01)
        assert member.join_ticket is None
        # b's rejoin does not end the phase: a has not rejoined; the rebalance timeout drops a
        result = await asyncio.wait_for(join(c, b.member_id), 5)
        assert (result.generation, [m for m, _i, _md in result.members]) == (2, [b.member_id])
    finally:
        await c.stop()
