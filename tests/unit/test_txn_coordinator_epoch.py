"""Coordinator epochs on transaction markers (Kafka's TRANSACTION_COORDINATOR_FENCED): a
partition's leader keeps, per producer, the highest coordinator epoch of the markers written
there (rebuilt from the log when the partition is loaded) and refuses an older one; each
broker taking a transactional id over bumps its coordinator epoch in the metadata database,
and a coordinator whose marker is refused stops (nothing written, the id dropped). The
s3stream engine on file:// objects, SQLite metadata (helpers of test_txn_coordinator)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import Settings, load_settings
from broker.errors import ErrorCode, KafkaError
from broker.protocol import records
from broker.txn.coordinator import TxnCoordinator
from broker.txn.index import PartitionTxns
from broker.txn.markers import ABORT, COMMIT, control_batch, marker_of
from broker.txn.state import TxnState
from tests.unit.test_txn_coordinator import Broker, close, open_broker, txn_batch


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({"data.dir": str(tmp_path / "data"),
                          "object.store": (tmp_path / "objects").as_uri(),
                          "wal.flush.interval.ms": "1"}, None, environ={})


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    b = await open_broker(settings)
    await b.storage.create_topic("t", 2, {})
    yield b
    await close(b)


async def marker(b: Broker, pid: int, epoch: int, commit: bool, coordinator_epoch: int) -> int:
    f = b.storage.append_marker("t", 0, pid, epoch, commit, coordinator_epoch)
    return (await asyncio.wait_for(f, 10)).base_offset


def test_a_marker_value_carries_the_coordinator_epoch() -> None:
    for commit, kind in ((True, COMMIT), (False, ABORT)):
        data = control_batch(77, 2, commit, 41)
        (h,) = records.validate(data)
        assert marker_of(data, h) == (kind, 41)
    p = PartitionTxns()
    data = control_batch(77, 2, True, 0)  # what markers carried before: 0, the lowest
    p.scan(data, records.iter_headers(data))
    assert p.coordinator_epochs == {77: 0}
    p.fence(77, 0)


async def test_the_leader_refuses_an_older_coordinator_epoch_also_after_a_reload(
    broker: Broker, settings: Settings
) -> None:
    b = broker
    pid, epoch = await b.txn.init_producer_id("e", 60_000, -1, -1)  # t-0 is transactional
    await b.txn.add_partitions("e", pid, epoch, [("t", 0)])
    await b.append("t", 0, txn_batch([b"a"], pid, epoch, 0))
    assert await marker(b, pid, epoch, True, 3) == 1  # higher than none: accepted
    await b.append("t", 0, txn_batch([b"b"], pid, epoch, 1))
    assert await marker(b, pid, epoch, False, 3) == 3  # equal: accepted
    await b.append("t", 0, txn_batch([b"c"], pid, epoch, 2))  # offset 4, left open
    with pytest.raises(KafkaError) as e:
        b.storage.append_marker("t", 0, pid, epoch, True, 2)  # lower: refused
    assert e.value.code == ErrorCode.transaction_coordinator_fenced
    assert b.storage.offsets("t", 0) == (0, 5)  # nothing written
    assert b.storage.last_stable_offset("t", 0) == 4
    assert b.storage.aborted_transactions("t", 0, 0, 5) == [(pid, 2)]
    other = pid + 1  # another producer: its own epochs
    assert await marker(b, other, 0, False, 0) == 5
    await close(b)

    again = await open_broker(settings)  # the partition's state rebuilt from its log
    try:
        assert again.storage.last_stable_offset("t", 0) == 4
        with pytest.raises(KafkaError) as e:
            again.storage.append_marker("t", 0, pid, epoch, True, 2)
        assert e.value.code == ErrorCode.transaction_coordinator_fenced
        assert again.storage.offsets("t", 0) == (0, 6)
        assert await marker(again, other, 0, True, 0) == 6  # markers of epoch 0 load
        assert await marker(again, pid, epoch, True, 3) == 7  # equal after the reload
        assert again.storage.last_stable_offset("t", 0) == 8
        assert again.storage.aborted_transactions("t", 0, 0, 8) == [(pid, 2)]
        await again.append("t", 0, txn_batch([b"d"], pid, epoch, 3))
        with pytest.raises(KafkaError) as e:
            again.storage.append_marker("t", 0, pid, epoch, False, 1)
        assert e.value.code == ErrorCode.transaction_coordinator_fenced
        assert await marker(again, pid, epoch, False, 9) == 9  # higher
    finally:
        await close(again)


async def test_a_coordinator_that_lost_the_id_is_fenced_and_stops(broker: Broker) -> None:
    """Coordinator A holds the id at coordinator epoch 0; B takes it over (epoch 1 in the
    database), commits the producer's transaction and the producer begins the next one. A's
    late marker for its stale copy is refused, A drops the id and writes nothing."""
    a = broker
    pid, epoch = await a.txn.init_producer_id("x", 60_000, -1, -1)
    await a.txn.add_partitions("x", pid, epoch, [("t", 0)])
    await a.append("t", 0, txn_batch([b"one"], pid, epoch, 0))
    stale = copy.deepcopy(a.txn.txns["x"])
    assert stale.coordinator_epoch == 0
    b = TxnCoordinator(a.storage, a.storage.kafka, a.offsets, check_interval_s=3600)
    await b.start()  # takes every id: a new coordinator epoch
    try:
        assert b.txns["x"].coordinator_epoch == 1
        row = await a.storage.kafka.load_txn("x")
        assert row is not None and row.coordinator_epoch == 1
        await b.end_txn("x", pid, epoch, commit=True)  # its marker: coordinator epoch 1
        await b.add_partitions("x", pid, epoch, [("t", 0)])
        await a.append("t", 0, txn_batch([b"two"], pid, epoch, 1))  # offset 2, open
        assert a.storage.last_stable_offset("t", 0) == 2

        stale.state = TxnState.PREPARE_ABORT  # A ends what it believes is open
        with pytest.raises(KafkaError) as e:
            await a.txn._complete(stale)
        assert e.value.code == ErrorCode.not_coordinator
        assert "x" not in a.txn.txns
        assert a.storage.offsets("t", 0) == (0, 3)  # no marker from A
        assert a.storage.last_stable_offset("t", 0) == 2
        row = await a.storage.kafka.load_txn("x")
        assert row is not None and row.state == "Ongoing" and row.coordinator_epoch == 1

        await b.end_txn("x", pid, epoch, commit=True)
        assert a.storage.last_stable_offset("t", 0) == 4
        assert a.storage.aborted_transactions("t", 0, 0, 4) == []
    finally:
        await b.stop()
