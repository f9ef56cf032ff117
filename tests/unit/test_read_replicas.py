"""Read replicas (broker.replicas, KIP-392): a broker reads a partition another broker leads
from the shared store, only what is committed, refreshed when asked at its end, reloaded when
compaction swapped its chunks; read_committed of a transactional partition is refused; the
leader's rack-aware choice of a preferred read replica; `replica.selector.class`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker import replicas
from broker.cluster import ClusterSettings
from broker.config import ConfigError
from broker.config.settings import RACK_AWARE_SELECTOR, check_replica_selector
from broker.errors import ErrorCode, KafkaError
from broker.protocol import records
from broker.storage import Storage
from s3stream.compaction import CompactionSettings, Compactor
from s3stream.log import WalSettings
from s3stream.metadata import open_metadata_store
from s3stream.objectstore import LocalDirObjectStore
from tests.rawclient import make_batch


def quiet(node_id: int, rack: str) -> ClusterSettings:
    """No heartbeat during a test: leadership changes only where the test makes them."""
    return ClusterSettings(node_id=node_id, rack=rack, heartbeat_interval_ms=600_000,
                           session_timeout_ms=600_000)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Storage, Storage]]:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    made = []
    for n, rack in ((1, "zone-a"), (2, "zone-b")):
        s = Storage(LocalDirObjectStore(tmp_path / "objects"), open_metadata_store(url),
                    WalSettings(flush_interval_ms=5), quiet(n, rack))
        await s.open()
        await s.advertise("127.0.0.1", 9000 + n)
        made.append(s)
        if n == 1:
            await s.create_topic("t", 1, {})
    b1, b2 = made
    await b1._sync()
    assert b1.led_epoch("t", 0) is not None and b2.led_epoch("t", 0) is None
    yield b1, b2
    for s in made:
        await s.close()


async def produce(s: Storage, values: list[bytes]) -> None:
    for v in values:
        await asyncio.wait_for(s.append("t", 0, make_batch([v])), 10)


def offsets(data: bytes) -> list[int]:
    return [h.base_offset for h in records.iter_headers(data)]  # one record per batch


async def same(b1: Storage, b2: Storage, offset: int) -> list[int]:
    """The replica's read at `offset` is byte for byte the leader's; its offsets."""
    got = await b2.replica_read("t", 0, offset, 1 << 20, False)
    assert got.data.tobytes() == await b1.read("t", 0, offset, 1 << 20, True)
    return offsets(got.data.tobytes())


async def test_a_replica_serves_committed_records_and_follows_new_ones(
    pair: tuple[Storage, Storage],
) -> None:
    b1, b2 = pair
    await produce(b1, [b"a", b"b", b"c"])
    got = await b2.replica_read("t", 0, 0, 1 << 20, False)
    assert await same(b1, b2, 0) == [0, 1, 2]
    assert (got.log_start, got.high_watermark) == (0, 3)
    assert await same(b1, b2, 1) == [1, 2]
    # at its end: a wait returns once the leader commits more (the replica refreshes)
    waiting = asyncio.ensure_future(b2.wait_for_data([("t", 0)], 5.0))
    await asyncio.sleep(0.05)
    await produce(b1, [b"d"])
    await asyncio.wait_for(waiting, 2.0)
    got = await b2.replica_read("t", 0, 3, 1 << 20, False)
    assert offsets(got.data.tobytes()) == [3] and got.high_watermark == 4
    assert b2.replicas.bytes_served > 0 and b1.replicas.bytes_served == 0
    # past the end (after a refresh): out of range, with the replica's high watermark
    await asyncio.sleep(replicas.REFRESH_S)
    with pytest.raises(KafkaError) as e:
        await b2.replica_read("t", 0, 9, 1 << 20, False)
    assert e.value.code == ErrorCode.offset_out_of_range
    # the leader does not read its own partition as a replica
    with pytest.raises(KafkaError) as e:
        await b1.replica_read("t", 0, 0, 1 << 20, False)
    assert e.value.code == ErrorCode.not_leader_or_follower


async def test_a_replica_reloads_chunks_compaction_replaced(
    pair: tuple[Storage, Storage],
) -> None:
    b1, b2 = pair
    await produce(b1, [b"%d" % i for i in range(20)])
    assert await same(b1, b2, 0) == list(range(20))
    before = {c.object_id for c in b2.replicas.streams[b2.stream_id("t", 0)].chunks}
    compactor = Compactor(b1.log, CompactionSettings(min_age_ms=0, gc_delay_ms=0))
    await compactor.run_once()
    await compactor.run_once()  # the GC deletes the WAL objects
    assert not before & {c.object_id for c in b1.log.stream(b1.stream_id("t", 0)).chunks}
    b2.log.cache.clear()  # the replica's chunks are not in its cache any more
    loads = b2.replicas.refreshes
    assert await same(b1, b2, 5) == list(range(5, 20))  # read from the compacted object
    assert b2.replicas.refreshes > loads  # the old objects were gone: the rows read again
    assert not before & {c.object_id for c in b2.replicas.streams[b2.stream_id("t", 0)].chunks}


async def test_read_committed_of_a_transactional_partition_goes_to_the_leader(
    pair: tuple[Storage, Storage],
) -> None:
    b1, b2 = pair
    await produce(b1, [b"a"])
    assert offsets((await b2.replica_read("t", 0, 0, 1 << 20, True)).data.tobytes()) == [0]
    sid = b1.stream_id("t", 0)

    def mark() -> None:
        with b1.meta._txn() as db:
            db.execute("INSERT INTO kafka_txn_streams(stream_id) VALUES (?)", (sid,))

    await b1.meta._run(mark)
    await produce(b1, [b"b"])
    await asyncio.sleep(replicas.REFRESH_S)
    with pytest.raises(KafkaError) as e:
        await b2.replica_read("t", 0, 1, 1 << 20, True)
    assert e.value.code == ErrorCode.not_leader_or_follower
    assert offsets((await b2.replica_read("t", 0, 1, 1 << 20, False)).data.tobytes()) == [1]


async def test_the_leader_prefers_a_live_broker_of_the_consumer_s_rack(
    pair: tuple[Storage, Storage],
) -> None:
    b1, _ = pair
    assert b1.preferred_read_replica("t", 0, "zone-b", False) == 2
    assert b1.preferred_read_replica("t", 0, "zone-a", False) == -1  # the leader's own
    assert b1.preferred_read_replica("t", 0, "zone-x", False) == -1  # no broker there
    b1.txns.index.reset(b1.stream_id("t", 0))  # a partition with transactions
    assert b1.preferred_read_replica("t", 0, "zone-b", True) == -1
    assert b1.preferred_read_replica("t", 0, "zone-b", False) == 2
    b1.rack_aware = False  # replica.selector.class=''
    assert b1.preferred_read_replica("t", 0, "zone-b", False) == -1


def test_replica_selector_class_is_kafka_s_rack_aware_one_or_off() -> None:
    assert check_replica_selector(RACK_AWARE_SELECTOR)
    assert check_replica_selector("")
    with pytest.raises(ConfigError, match="not supported"):
        check_replica_selector("org.example.MySelector")


def test_one_read_replica_per_other_rack_picked_by_the_stream_id() -> None:
    from broker.cluster.model import BrokerInfo
    from broker.cluster.racks import rack_replica, read_replicas

    live = [BrokerInfo(n, "h", 9000 + n, rack) for n, rack in
            ((1, "a"), (2, "b"), (3, "b"), (4, "c"), (5, None))]
    assert read_replicas(live, 1, 0) == [2, 4]
    assert read_replicas(live, 1, 1) == [3, 4]  # the rack's brokers share its partitions
    assert read_replicas(live, 2, 0) == [1, 4]  # none more of the leader's own rack
    assert read_replicas(live, 5, 7) == [1, 3, 4]  # a leader without a rack
    assert read_replicas([b for b in live if b.rack is None], 5, 0) == []
    assert [rack_replica(live, "b", s) for s in range(4)] == [2, 3, 2, 3]
    assert rack_replica(live, "x", 0) == -1
