"""The cluster's rows (broker.cluster.tables) on SQLite and PostgreSQL: registration, the
controller role, leader assignment by the controller's heartbeat, a dead broker's partitions
moving, graceful leave, and a second process of one node id fencing the first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from broker.cluster import tables
from broker.cluster.model import NO_LEADER, Leader, Snapshot
from broker.metadata import KafkaMetadata
from s3stream.metadata import open_metadata_store
from s3stream.metadata.backend import Connection
from s3stream.metadata.postgres import IDLE_IN_TRANSACTION_S

T = TypeVar("T")
NOW = 1_000_000
A = tables.Me(1, "a", None, 2000)
B = tables.Me(2, "b", "rack-b", 2000)


@pytest.fixture(params=["sqlite", "postgresql"])
async def kafka(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KafkaMetadata]:
    url = (f"sqlite:///{tmp_path / 'meta.db'}" if request.param == "sqlite"
           else str(request.getfixturevalue("pg_url")))
    k = KafkaMetadata(open_metadata_store(url))
    await k.open()
    await k.create_topic("t", 4, {})
    yield k
    await k.close()


async def txn(k: KafkaMetadata, fn: Callable[[Connection], T]) -> T:
    def run() -> T:
        with k.store._txn() as db:
            return fn(db)
    return await k.store._run(run)


async def beat(k: KafkaMetadata, me: tables.Me, now: int) -> Snapshot:
    return await txn(k, lambda db: tables.heartbeat(db, me, now, k.store.for_update))


def led(snap: Snapshot) -> dict[int, int]:
    return {n: sum(1 for lead in snap.view.leaders.values() if lead.node_id == n)
            for n in {lead.node_id for lead in snap.view.leaders.values()}}


async def test_controller_assigns_moves_a_dead_brokers_partitions_and_leave_hands_over(
    kafka: KafkaMetadata,
) -> None:
    await txn(kafka, lambda db: tables.register(db, A, NOW))
    await txn(kafka, lambda db: tables.advertise(db, A, "h", 1))
    first = await beat(kafka, A, NOW)
    assert first.view.controller == 1 and led(first) == {1: 4}
    assert {lead.epoch for lead in first.view.leaders.values()} == {1}
    await txn(kafka, lambda db: tables.register(db, B, NOW))
    await txn(kafka, lambda db: tables.advertise(db, B, "h", 2))
    assert (await beat(kafka, B, NOW)).view.controller == 1  # A is alive: stays controller
    balanced = await beat(kafka, A, NOW + 100)
    assert led(balanced) == {1: 2, 2: 2}
    assert [b.rack for b in balanced.view.brokers] == [None, "rack-b"]
    moved = {s for s, lead in balanced.view.leaders.items() if lead.node_id == 2}
    assert {balanced.view.leaders[s].epoch for s in moved} == {2}

    # A stops renewing: once its lease ran out, B's heartbeat takes the controller role and
    # A's partitions, each with the next epoch
    later = await beat(kafka, B, NOW + 2500)
    assert later.view.controller == 2 and led(later) == {2: 4}
    assert [b.node_id for b in later.view.brokers] == [2]
    assert all(later.view.leaders[s] == Leader(2, 2) for s in later.view.leaders
               if s not in moved)

    # B leaves gracefully: no leader, next epoch, no controller, no lease
    assert await txn(kafka, lambda db: tables.leave(db, B)) == 4
    after = await beat(kafka, A, NOW + 2600)  # A (renewing again) sees it
    assert after.registered and after.view.controller == 1
    assert led(after) == {1: 4}  # ...and, controller again, places them at once
    assert all(lead.epoch == 4 for lead in after.view.leaders.values())  # leave, assign


async def test_a_second_process_of_a_node_id_fences_the_first(kafka: KafkaMetadata) -> None:
    await txn(kafka, lambda db: tables.register(db, A, NOW))
    first = await beat(kafka, A, NOW)
    again = tables.Me(1, "a2", None, 2000)
    await txn(kafka, lambda db: tables.register(db, again, NOW + 10))
    stale = await beat(kafka, A, NOW + 20)
    assert not stale.registered  # the first process learns it was replaced
    assert await txn(kafka, lambda db: tables.leave(db, A)) == 0  # and cannot give anything up
    fresh = await beat(kafka, again, NOW + 30)
    assert fresh.registered and fresh.view.controller == 1
    # every partition the old process led has a newer epoch: its commits are refused
    assert all(fresh.view.leaders[s].epoch > first.view.leaders[s].epoch
               for s in first.view.leaders)
    assert NO_LEADER not in {lead.node_id for lead in fresh.view.leaders.values()}


async def test_a_pin_moves_a_partition_keeps_it_there_and_is_cancelled(
    kafka: KafkaMetadata,
) -> None:
    await txn(kafka, lambda db: tables.register(db, A, NOW))
    await txn(kafka, lambda db: tables.advertise(db, A, "h", 1))
    await txn(kafka, lambda db: tables.register(db, B, NOW))
    await txn(kafka, lambda db: tables.advertise(db, B, "h", 2))
    snap = await beat(kafka, A, NOW)  # A controls; 2 and 2
    by_partition = dict(zip(range(4), sorted(snap.view.leaders), strict=True))
    sid = next(s for s in sorted(snap.view.leaders) if snap.view.leaders[s].node_id == 1)
    part = next(p for p, s in by_partition.items() if s == sid)
    epoch = snap.view.leaders[sid].epoch

    async def pin(target: int | None, partition: int = part, topic: str = "t") -> str | None:
        try:
            await txn(kafka, lambda db: tables.pin(db, topic, partition, target))
            return None
        except tables.PinError as e:
            return e.reason

    assert await pin(7) == "broker"  # no such broker registered
    assert await pin(2, 9) == "unknown" and await pin(2, 0, "nope") == "unknown"
    assert await pin(None) == "none"  # nothing to cancel
    assert await pin(2) is None
    [p] = await txn(kafka, tables.pins)
    assert (p.topic, p.partition, p.leader, p.target, p.done) == ("t", part, 1, 2, False)
    moved = await beat(kafka, A, NOW + 100)  # the controller moves it, next epoch
    assert moved.view.leaders[sid] == Leader(2, epoch + 1)
    assert led(moved) == {1: 2, 2: 2}  # and rebalances the others around it
    assert (await txn(kafka, tables.pins))[0].done
    for t in range(200, 1000, 200):  # never balanced back
        assert (await beat(kafka, A, NOW + t)).view.leaders[sid].node_id == 2
    # B dies: the partition goes to A; B back: it returns to B
    gone = await beat(kafka, A, NOW + 2500)
    assert gone.view.leaders[sid].node_id == 1
    await txn(kafka, lambda db: tables.register(db, B, NOW + 2600))
    await txn(kafka, lambda db: tables.advertise(db, B, "h", 2))
    back = await beat(kafka, A, NOW + 2700)
    assert back.view.leaders[sid].node_id == 2
    assert await pin(None) is None and await txn(kafka, tables.pins) == []


async def test_a_controller_stopped_inside_its_heartbeat_does_not_stop_the_others(
    pg_url: str,
) -> None:
    """The controller paused (SIGSTOP) between its heartbeat's statements holds the controller
    row's lock. On PostgreSQL the session is ended after IDLE_IN_TRANSACTION_S, so the other
    broker's heartbeat goes through and takes over (before: it waited as long as the pause,
    its own lease lapsing too: nobody led anything). SQLite cannot do this (README)."""
    k = KafkaMetadata(open_metadata_store(pg_url))
    await k.open()
    try:
        await k.create_topic("t", 4, {})
        await txn(k, lambda db: tables.register(db, A, NOW))
        await txn(k, lambda db: tables.register(db, B, NOW))
        await txn(k, lambda db: tables.advertise(db, A, "h", 1))
        await txn(k, lambda db: tables.advertise(db, B, "h", 2))
        assert (await beat(k, A, NOW)).view.controller == 1
        stalled = k.store.backend.connect()
        try:
            stalled.execute("BEGIN")  # A's next heartbeat, stopped half-way
            tables.heartbeat(stalled, A, NOW + 100, k.store.for_update)
            start = asyncio.get_running_loop().time()
            taken = await asyncio.wait_for(beat(k, B, NOW + 2500), 30)
            waited = asyncio.get_running_loop().time() - start
        finally:
            stalled.close()
        assert taken.view.controller == 2 and led(taken) == {2: 4}
        assert waited < IDLE_IN_TRANSACTION_S + 3, waited
    finally:
        await k.close()
