"""The transaction coordinator on a cluster (broker.txn.coordinator with fakes for storage
and the metadata database): ids placed on another broker answer NOT_COORDINATOR; an id whose
slot moves here is read from the database and its prepared transaction completed; markers for
partitions led elsewhere go to their leader (WriteTxnMarkers, broker.txn.remote.send), asked
again after the next view until written; a leader checks a transactional write of an id
coordinated elsewhere against the id's row once per transaction."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from broker.cluster.coordinators import slot_of, slot_owner
from broker.cluster.model import BrokerInfo, ClusterView, Leader
from broker.engine import AppendResult
from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import MemoryGroupOffsets, OffsetStore
from broker.metadata.model import OffsetRow
from broker.metadata.txns import PendingOffsetRow, TxnConflictError, TxnRow
from broker.txn import coordinator as coordinator_mod
from broker.txn import remote
from broker.txn.coordinator import TxnCoordinator
from broker.txn.state import TxnState

ME = 1


def view(*nodes: int, leaders: dict[int, int] | None = None) -> ClusterView:
    return ClusterView(
        brokers=tuple(BrokerInfo(n, "127.0.0.1", 9000 + n, None) for n in nodes),
        leaders={sid: Leader(n, 1) for sid, n in (leaders or {}).items()})


def tid_on(node: int, nodes: list[int]) -> str:
    return next(t for t in (f"t-{i}" for i in range(10_000))
                if slot_owner(slot_of(t), nodes) == node)


class FakeStorage:
    """Partition p of topic "t" is stream p; this broker leads the streams in `led`."""

    def __init__(self) -> None:
        self.view: ClusterView | None = None
        self.led: set[int] = set()
        self.markers: list[tuple[str, int, int, int, bool]] = []

    def cluster_view(self) -> ClusterView | None:
        return self.view

    def stream_id(self, topic: str, partition: int) -> int:
        if topic != "t":
            raise KafkaError(ErrorCode.unknown_topic_or_partition)
        return partition

    def led_epoch(self, topic: str, partition: int) -> int | None:
        return 1 if partition in self.led else None

    async def init_producer_id(self, producer_id: int, epoch: int) -> tuple[int, int]:
        return 1000, 0

    def append_marker(self, topic: str, partition: int, producer_id: int, epoch: int,
                      commit: bool, coordinator_epoch: int) -> asyncio.Future[AppendResult]:
        if partition not in self.led:
            raise KafkaError(ErrorCode.not_leader_or_follower)
        self.markers.append((topic, partition, producer_id, epoch, commit))
        f: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        f.set_result(AppendResult(0, -1))
        return f


class FakeBackend:
    def __init__(self) -> None:
        self.rows: dict[str, TxnRow] = {}
        self.pending: list[PendingOffsetRow] = []
        self.reads = 0

    async def load_txns(self) -> tuple[list[TxnRow], list[PendingOffsetRow]]:
        return list(self.rows.values()), list(self.pending)

    async def take_txns(
        self, take: Callable[[str], bool]
    ) -> tuple[list[TxnRow], list[PendingOffsetRow]]:
        for tid in [t for t in self.rows if take(t)]:
            await self.take_txn(tid)
        return await self.load_txns()

    async def load_txn(self, tid: str) -> TxnRow | None:
        self.reads += 1
        return self.rows.get(tid)

    async def take_txn(self, tid: str) -> TxnRow | None:
        row = self.rows.get(tid)
        if row is not None:
            self.rows[tid] = dataclasses.replace(
                row, coordinator_epoch=row.coordinator_epoch + 1)
        return await self.load_txn(tid)

    async def save_txn(self, row: TxnRow, new_partitions: list[tuple[str, int]],
                       read_version: int | None) -> None:
        old = self.rows.get(row.transactional_id)
        if (None if old is None else old.update_ms) != read_version:
            raise TxnConflictError(row.transactional_id)
        if old is not None:  # as the database: an update keeps the coordinator epoch
            row = dataclasses.replace(row, coordinator_epoch=old.coordinator_epoch)
        self.rows[row.transactional_id] = row

    async def add_txn_offsets(self, rows: list[PendingOffsetRow]) -> None:
        self.pending.extend(rows)

    async def end_txn(self, row: TxnRow, commit: bool, read_version: int) -> list[OffsetRow]:
        await self.save_txn(row, [], read_version)
        self.pending = [p for p in self.pending if p.transactional_id != row.transactional_id]
        return []


def coordinator(storage: FakeStorage, backend: FakeBackend) -> TxnCoordinator:
    c = TxnCoordinator(storage, backend, OffsetStore(MemoryGroupOffsets()),  # type: ignore[arg-type]
                       check_interval_s=3600, node_id=ME)
    c.marker_timeout_s = 5.0
    return c


async def test_an_id_placed_elsewhere_is_not_coordinated_here() -> None:
    storage, backend = FakeStorage(), FakeBackend()
    storage.view = view(1, 2, 3)
    c = coordinator(storage, backend)
    other = tid_on(2, [1, 2, 3])
    for call in (c.init_producer_id(other, 60_000, -1, -1),
                 c.add_partitions(other, 1000, 0, [("t", 0)]),
                 c.add_offsets(other, 1000, 0, "g"),
                 c.end_txn(other, 1000, 0, True)):
        with pytest.raises(KafkaError) as e:
            await call
        assert e.value.code == ErrorCode.not_coordinator
    mine = tid_on(ME, [1, 2, 3])
    assert await c.init_producer_id(mine, 60_000, -1, -1) == (1000, 0)
    assert set(c.txns) == {mine}


async def test_a_moved_id_is_loaded_and_its_prepared_commit_completed_on_every_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broker 2 died with a transaction in PrepareCommit over partitions led by 1 and 3; the
    id's slot moves to broker 1: its markers are written (partition 2's leader refuses at
    first, the next view names broker 1), then the transaction is CompleteCommit."""
    storage, backend = FakeStorage(), FakeBackend()
    tid = next(t for t in (f"t-{i}" for i in range(10_000))
               if slot_owner(slot_of(t), [1, 2, 3]) == 2 and slot_owner(slot_of(t), [1, 3]) == 1)
    backend.rows[tid] = TxnRow(tid, 1000, 4, TxnState.PREPARE_COMMIT.value,
                               (("t", 0), ("t", 1), ("t", 2)), (), 60_000, 1, 5)
    storage.led = {0}
    storage.view = view(1, 2, 3, leaders={0: 1, 1: 3, 2: 3})
    c = coordinator(storage, backend)
    await c.sync()
    assert tid not in c.txns  # broker 2 coordinates it
    sent: list[tuple[str, tuple[tuple[str, int], ...]]] = []

    def send(address: str, markers: list[remote.Marker]) -> dict[Any, ErrorCode]:
        (m,) = markers
        assert (m.producer_id, m.epoch, m.commit) == (1000, 4, True)
        sent.append((address, m.partitions))
        return {(m.producer_id, t, p): ErrorCode.none if p == 1
                else ErrorCode.not_leader_or_follower for t, p in m.partitions}

    monkeypatch.setattr(remote, "send", send)
    storage.view = view(1, 3, leaders={0: 1, 1: 3, 2: 3})  # broker 2's lease ran out

    async def next_view() -> None:  # partition 2 turns out to be led by broker 1 now
        await asyncio.sleep(0.1)
        storage.led = {0, 2}
        storage.view = view(1, 3, leaders={0: 1, 1: 3, 2: 1})

    mover = asyncio.create_task(next_view())
    await c.check_once()
    await mover
    assert c.txns[tid].state == TxnState.COMPLETE_COMMIT
    assert backend.rows[tid].state == "CompleteCommit"
    assert sorted(tp[:2] for tp in storage.markers) == [("t", 0), ("t", 2)]
    assert all(tp[2:] == (1000, 4, True) for tp in storage.markers)
    # refused by broker 3, partition 2 was asked again of its leader in the next view
    assert sent == [("127.0.0.1:9003", (("t", 1), ("t", 2)))]


async def test_markers_missing_past_the_deadline_leave_the_transaction_prepared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage, backend = FakeStorage(), FakeBackend()
    storage.view = view(1, 2, leaders={0: 1, 1: 2})
    storage.led = {0}
    tid = tid_on(ME, [1, 2])
    c = coordinator(storage, backend)
    c.marker_timeout_s = 0.3
    monkeypatch.setattr(coordinator_mod, "VIEW_WAIT_S", 0.05)
    monkeypatch.setattr(remote, "send", lambda address, markers: {
        (m.producer_id, t, p): ErrorCode.network_exception
        for m in markers for t, p in m.partitions})
    pid, epoch = await c.init_producer_id(tid, 60_000, -1, -1)
    await c.add_partitions(tid, pid, epoch, [("t", 0), ("t", 1)])
    with pytest.raises(KafkaError) as e:
        await c.end_txn(tid, pid, epoch, True)
    assert e.value.code in (ErrorCode.request_timed_out, ErrorCode.kafka_storage_error)
    assert c.txns[tid].state == TxnState.PREPARE_COMMIT  # the next round tries again
    monkeypatch.setattr(remote, "send", lambda address, markers: {
        (m.producer_id, t, p): ErrorCode.none for m in markers for t, p in m.partitions})
    await c.end_txn(tid, pid, epoch, True)  # the client's retry completes it
    assert c.txns[tid].state == TxnState.COMPLETE_COMMIT


async def test_a_write_for_an_id_coordinated_elsewhere_is_checked_against_its_row() -> None:
    storage, backend = FakeStorage(), FakeBackend()
    storage.view = view(1, 2)
    storage.led = {0}
    tid = tid_on(2, [1, 2])
    c = coordinator(storage, backend)
    with pytest.raises(KafkaError) as e:
        await c.verify_write(tid, 1000, 0, "t", 0)
    assert e.value.code == ErrorCode.invalid_producer_id_mapping
    backend.rows[tid] = TxnRow(tid, 1000, 0, "Ongoing", (("t", 1),), (), 60_000, 1, 2)
    with pytest.raises(KafkaError) as e:  # partition 0 not added (KIP-890 part 1)
        await c.verify_write(tid, 1000, 0, "t", 0)
    assert e.value.code == ErrorCode.invalid_txn_state
    backend.rows[tid] = TxnRow(tid, 1000, 0, "Ongoing", (("t", 0),), (), 60_000, 1, 3)
    await c.verify_write(tid, 1000, 0, "t", 0)
    reads = backend.reads
    await c.verify_write(tid, 1000, 0, "t", 0)  # the same transaction: not read again
    assert backend.reads == reads
    backend.rows[tid] = TxnRow(tid, 1000, 1, "CompleteAbort", (), (), 60_000, -1, 4, 0)
    c.marker_written(1000, "t", 0)  # the abort's marker: the next write is checked again
    with pytest.raises(KafkaError) as e:
        await c.verify_write(tid, 1000, 0, "t", 0)
    assert e.value.code in (ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced)


async def test_markers_stop_once_another_coordinator_completed_the_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A coordinator retrying a marker finds the id's row changed (the id's new coordinator
    completed the transaction, the producer may have begun the next): it sends nothing more
    and takes the row as it is."""
    storage, backend = FakeStorage(), FakeBackend()
    storage.view = view(1, 2, leaders={0: 2})
    tid = tid_on(ME, [1, 2])
    c = coordinator(storage, backend)
    monkeypatch.setattr(coordinator_mod, "VIEW_WAIT_S", 0.05)
    sent: list[str] = []

    def send(address: str, markers: list[remote.Marker]) -> dict[Any, ErrorCode]:
        sent.append(address)
        row = backend.rows[tid]  # meanwhile, another coordinator completes it
        backend.rows[tid] = TxnRow(tid, row.producer_id, row.epoch, "CompleteCommit", (), (),
                                   row.timeout_ms, -1, row.update_ms + 1)
        return {(m.producer_id, t, p): ErrorCode.network_exception
                for m in markers for t, p in m.partitions}

    monkeypatch.setattr(remote, "send", send)
    pid, epoch = await c.init_producer_id(tid, 60_000, -1, -1)
    await c.add_partitions(tid, pid, epoch, [("t", 0)])
    with pytest.raises(KafkaError) as e:
        await c.end_txn(tid, pid, epoch, True)
    assert e.value.code == ErrorCode.concurrent_transactions
    assert sent == ["127.0.0.1:9002"]  # not asked again
    assert c.txns[tid].state == TxnState.COMPLETE_COMMIT
    await c.end_txn(tid, pid, epoch, True)  # the client's retry: done already
