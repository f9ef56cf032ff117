"""The transaction coordinator over the s3stream engine on file:// objects (SQLite metadata):
markers, the last stable offset and aborted ranges (also after a restart, rebuilt from the
log), fencing, KIP-890's partition check, expiry, pending offsets, and a coordinator that
stopped between its Prepare* state and the markers finishing them when it starts again."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from crc32c import crc32c

from broker.app import build_storage
from broker.config import Settings, load_settings, topic_defaults
from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import OffsetStore
from broker.protocol import records
from broker.storage import Storage
from broker.txn.coordinator import TxnCoordinator
from broker.txn.markers import ABORT, COMMIT, control_batch, marker_type
from broker.txn.state import TxnMeta, TxnState
from tests.rawclient import make_batch


def txn_batch(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    """A transactional batch (make_batch with the transactional attribute, CRC redone)."""
    buf = make_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    attrs = struct.unpack_from(">h", buf, 21)[0] | records.TRANSACTIONAL_BIT
    struct.pack_into(">h", buf, 21, attrs)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({"data.dir": str(tmp_path / "data"),
                          "object.store": (tmp_path / "objects").as_uri(),
                          "wal.flush.interval.ms": "1"}, None, environ={})


class Broker:
    def __init__(self, storage: Storage, txn: TxnCoordinator, offsets: OffsetStore) -> None:
        self.storage, self.txn, self.offsets = storage, txn, offsets
        self.closed = False

    async def append(self, topic: str, partition: int, data: bytes) -> int:
        return (await asyncio.wait_for(self.storage.append(topic, partition, data), 10)).base_offset


async def open_broker(settings: Settings) -> Broker:
    storage = build_storage(settings)
    storage.topic_defaults.update(topic_defaults(settings))
    await storage.open()
    offsets = OffsetStore(storage.group_offsets)
    await offsets.load()
    txn = TxnCoordinator(storage, storage.kafka, offsets, check_interval_s=3600)
    await txn.start()
    return Broker(storage, txn, offsets)


async def close(b: Broker) -> None:
    if b.closed:
        return
    b.closed = True
    await b.txn.stop()
    await b.storage.close()


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    b = await open_broker(settings)
    await b.storage.create_topic("t", 2, {})
    yield b
    await close(b)


def test_marker_batches_are_valid_and_parse_back() -> None:
    for commit, kind in ((True, COMMIT), (False, ABORT)):
        data = control_batch(1234, 7, commit, 3)
        (h,) = records.validate(data)  # CRC and framing
        assert h.is_control and h.producer_id == 1234 and h.producer_epoch == 7
        assert h.base_sequence == -1 and h.record_count == 1
        assert marker_type(data, h) == kind


async def test_abort_hides_the_range_and_the_state_survives_a_restart(
    broker: Broker, settings: Settings
) -> None:
    b = broker
    pid, epoch = await b.txn.init_producer_id("a", 60_000, -1, -1)
    await b.append("t", 0, bytes(make_batch([b"plain"])))
    assert await b.txn.add_partitions("a", pid, epoch, [("t", 0)]) == {("t", 0): ErrorCode.none}
    b.txn.check_write("a", pid, epoch, "t", 0)
    first = await b.append("t", 0, txn_batch([b"x", b"y"], pid, epoch, 0))
    assert first == 1
    assert b.storage.last_stable_offset("t", 0) == 1  # held at the open transaction
    assert b.storage.offsets("t", 0) == (0, 3)
    await b.txn.end_txn("a", pid, epoch, commit=False)
    assert b.storage.offsets("t", 0) == (0, 4)  # + the marker
    assert b.storage.last_stable_offset("t", 0) == 4
    assert b.storage.aborted_transactions("t", 0, 0, 4) == [(pid, 1)]
    assert b.storage.aborted_transactions("t", 0, 4, 4) == []
    # a second transaction left open by a broker that stops
    await b.txn.add_partitions("a", pid, epoch, [("t", 0)])
    await b.append("t", 0, txn_batch([b"z"], pid, epoch, 2))
    assert b.storage.last_stable_offset("t", 0) == 4
    await close(b)

    again = await open_broker(settings)
    try:
        assert again.storage.offsets("t", 0) == (0, 5)
        assert again.storage.last_stable_offset("t", 0) == 4  # rebuilt from the log
        assert again.storage.aborted_transactions("t", 0, 0, 5) == [(pid, 1)]
        assert again.txn.txns["a"].state == TxnState.ONGOING
        await again.txn.end_txn("a", pid, epoch, commit=True)
        assert again.storage.last_stable_offset("t", 0) == 6
        assert again.storage.aborted_transactions("t", 0, 0, 6) == [(pid, 1)]
    finally:
        await close(again)


async def test_a_new_producer_fences_the_old_and_aborts_its_transaction(broker: Broker) -> None:
    b = broker
    pid, old = await b.txn.init_producer_id("z", 60_000, -1, -1)
    await b.txn.add_partitions("z", pid, old, [("t", 1)])
    await b.append("t", 1, txn_batch([b"zombie"], pid, old, 0))
    pid2, new = await b.txn.init_producer_id("z", 60_000, -1, -1)
    assert pid2 == pid and new == old + 2  # one bump for the abort's markers, one for it
    assert b.storage.last_stable_offset("t", 1) == 2
    assert b.storage.aborted_transactions("t", 1, 0, 2) == [(pid, 0)]
    for call in (b.txn.end_txn("z", pid, old, True),
                 b.txn.add_partitions("z", pid, old, [("t", 1)])):
        with pytest.raises(KafkaError) as e:
            await call
        assert e.value.code == ErrorCode.producer_fenced
    with pytest.raises(KafkaError) as e:
        b.txn.check_write("z", pid, old, "t", 1)
    assert e.value.code == ErrorCode.invalid_producer_epoch
    await b.txn.add_partitions("z", pid, new, [("t", 1)])
    with pytest.raises(KafkaError) as e:  # KIP-890: a partition not added to the transaction
        b.txn.check_write("z", pid, new, "t", 0)
    assert e.value.code == ErrorCode.invalid_txn_state
    with pytest.raises(KafkaError) as e:
        await b.txn.init_producer_id("z", 60_000, pid, old)  # KIP-360 with a stale epoch
    assert e.value.code == ErrorCode.producer_fenced


async def test_expired_transactions_are_aborted_with_a_bumped_epoch(broker: Broker) -> None:
    b = broker
    pid, epoch = await b.txn.init_producer_id("slow", 1000, -1, -1)
    await b.txn.add_partitions("slow", pid, epoch, [("t", 0)])
    await b.append("t", 0, txn_batch([b"late"], pid, epoch, 0))
    await b.txn.check_once()
    assert b.txn.txns["slow"].state == TxnState.ONGOING  # not expired yet
    await asyncio.sleep(1.1)
    await b.txn.check_once()
    meta = b.txn.txns["slow"]
    assert meta.state == TxnState.COMPLETE_ABORT and meta.epoch == epoch + 1
    assert b.storage.last_stable_offset("t", 0) == 2
    with pytest.raises(KafkaError) as e:  # KIP-588: retriable, the producer may recover
        await b.txn.end_txn("slow", pid, epoch, True)
    assert e.value.code == ErrorCode.invalid_producer_epoch
    await b.txn.end_txn("slow", pid, epoch, False)  # its abort: done already
    with pytest.raises(KafkaError) as e:  # which does not give the old epoch back: a producer
        await b.txn.add_partitions("slow", pid, epoch, [("t", 0)])  # must bump it first
    assert e.value.code == ErrorCode.invalid_producer_epoch
    assert await b.txn.init_producer_id("slow", 1000, pid, epoch) == (pid, epoch + 2)
    with pytest.raises(KafkaError) as e:  # a new instance fences it for good
        await b.txn.init_producer_id("slow", 1000, -1, -1)
        await b.txn.end_txn("slow", pid, epoch + 2, True)
    assert e.value.code == ErrorCode.producer_fenced


async def test_offsets_commit_with_the_transaction_or_not_at_all(broker: Broker) -> None:
    b = broker
    pid, epoch = await b.txn.init_producer_id("o", 60_000, -1, -1)
    for commit, offset in ((False, 5), (True, 9)):
        await b.txn.add_offsets("o", pid, epoch, "g")
        await b.txn.txn_offset_commit("o", "g", pid, epoch, [("t", 0, offset, -1, None)])
        assert b.txn.has_pending_offset("g", "t", 0)
        assert b.offsets.get("g", "t", 0) is None
        await b.txn.end_txn("o", pid, epoch, commit)
        assert not b.txn.has_pending_offset("g", "t", 0)
    row = b.offsets.get("g", "t", 0)
    assert row is not None and row.committed_offset == 9
    assert [(r.group_id, r.committed_offset) for r in await b.storage.kafka.load_offsets()] == [
        ("g", 9)]


async def test_a_prepared_commit_is_finished_when_the_coordinator_starts(
    broker: Broker, settings: Settings
) -> None:
    """The coordinator stopped after writing PrepareCommit, before any marker."""
    b = broker
    pid, epoch = await b.txn.init_producer_id("p", 60_000, -1, -1)
    await b.txn.add_partitions("p", pid, epoch, [("t", 0), ("t", 1)])
    await b.txn.add_offsets("p", pid, epoch, "g")
    await b.txn.txn_offset_commit("p", "g", pid, epoch, [("t", 0, 1, -1, None)])
    await b.append("t", 0, txn_batch([b"a"], pid, epoch, 0))
    await b.append("t", 1, txn_batch([b"b"], pid, epoch, 0))
    read = b.txn.txns["p"].update_ms
    prepared = TxnMeta.of(b.txn.txns["p"].row())
    prepared.state, prepared.update_ms = TxnState.PREPARE_COMMIT, read + 1
    await b.storage.kafka.save_txn(prepared.row(), [], read)
    await close(b)

    again = await open_broker(settings)
    try:
        assert again.txn.txns["p"].state == TxnState.COMPLETE_COMMIT
        for partition in (0, 1):
            assert again.storage.offsets("t", partition) == (0, 2)  # record + commit marker
            assert again.storage.last_stable_offset("t", partition) == 2
            assert again.storage.aborted_transactions("t", partition, 0, 2) == []
        row = again.offsets.get("g", "t", 0)
        assert row is not None and row.committed_offset == 1
    finally:
        await close(again)


async def test_a_coordinator_with_a_stale_copy_changes_nothing(broker: Broker) -> None:
    """Coordinator B loaded the state before A committed; B's expiry would abort the
    transaction from its stale copy: its write is refused, it takes the row as it is."""
    a = broker
    pid, epoch = await a.txn.init_producer_id("s", 1000, -1, -1)
    await a.txn.add_partitions("s", pid, epoch, [("t", 0)])
    await a.append("t", 0, txn_batch([b"v"], pid, epoch, 0))
    b = TxnCoordinator(a.storage, a.storage.kafka, a.offsets, check_interval_s=3600)
    await b.start()
    await a.txn.end_txn("s", pid, epoch, commit=True)
    await asyncio.sleep(1.1)
    await b.check_once()  # stale: Ongoing and expired
    meta = b.txns["s"]
    assert (meta.state, meta.epoch) == (TxnState.COMPLETE_COMMIT, epoch)
    assert a.storage.offsets("t", 0) == (0, 2)  # the record and the commit marker only
    assert a.storage.last_stable_offset("t", 0) == 2
    row = await a.storage.kafka.load_txn("s")
    assert row is not None and row.state == "CompleteCommit"
    await b.stop()


async def test_the_lso_is_never_below_the_log_start(broker: Broker) -> None:
    b = broker
    pid, epoch = await b.txn.init_producer_id("d", 60_000, -1, -1)
    await b.txn.add_partitions("d", pid, epoch, [("t", 0)])
    await b.append("t", 0, txn_batch([b"open"], pid, epoch, 0))
    await b.append("t", 0, bytes(make_batch([b"plain"])))
    assert b.storage.last_stable_offset("t", 0) == 0
    await b.storage.delete_records("t", 0, 1)  # past the open transaction's first record
    assert b.storage.last_stable_offset("t", 0) == 1
