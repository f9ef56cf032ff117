"""Fencing (broker.cluster.guard): every WAL commit checks, in its own transaction, that the
broker still holds its lease and leads each stream at the epoch it holds; a refused stream's
appends fail with NOT_LEADER_OR_FOLLOWER and nothing of them lands, the other streams of the
same flush commit. On SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.cluster import ClusterSettings
from broker.cluster.guard import LeaderGuard
from broker.engine import AppendResult
from broker.errors import ErrorCode, KafkaError
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import ChunkRow, StreamsFencedError, open_metadata_store
from s3stream.objectstore import LocalDirObjectStore
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)
from tests.rawclient import make_batch

# no heartbeat during a test: leadership changes only where the test makes them
QUIET = ClusterSettings(node_id=1, heartbeat_interval_ms=600_000, session_timeout_ms=600_000)


@pytest.fixture
async def broker(metadata_url: str, tmp_path: Path) -> AsyncIterator[Storage]:
    s = Storage(LocalDirObjectStore(tmp_path / "objects"), open_metadata_store(metadata_url),
                WalSettings(flush_interval_ms=20), QUIET)
    await s.open()
    await s.create_topic("t", 2, {})
    yield s
    await s.close()


async def sql(s: Storage, statement: str, *params: object) -> list[tuple[object, ...]]:
    def run() -> list[tuple[object, ...]]:
        with s.meta._txn() as db:
            cursor = db.execute(statement, params)
            return [tuple(r) for r in cursor] if statement.startswith("SELECT") else []
    return await s.meta._run(run)


async def outcome(f: asyncio.Future[AppendResult]) -> int | ErrorCode:
    try:
        return (await asyncio.wait_for(f, 10)).base_offset
    except KafkaError as e:
        return e.code


async def ends(s: Storage) -> list[int]:
    rows = await sql(s, "SELECT s.end_offset FROM streams s JOIN kafka_partitions k"
                        " USING (stream_id) ORDER BY k.partition")
    return [int(str(e)) for (e,) in rows]


async def test_a_commit_for_a_partition_led_elsewhere_is_refused_the_others_land(
    broker: Storage,
) -> None:
    assert [await outcome(broker.append("t", p, make_batch([b"a"]))) for p in (0, 1)] == [0, 0]
    sid0 = broker.stream_id("t", 0)
    # the controller moved partition 0 to broker 2; this broker has not heard of it yet
    await sql(broker, "UPDATE kafka_partitions SET leader=2, leader_epoch=leader_epoch+1"
                      " WHERE stream_id=?", sid0)
    moved = broker.append("t", 0, make_batch([b"lost"]))  # same flush as the next one
    kept = broker.append("t", 1, make_batch([b"kept"]))
    assert await outcome(moved) == ErrorCode.not_leader_or_follower
    assert await outcome(kept) == 1
    assert await ends(broker) == [1, 2]  # nothing of partition 0's append landed
    assert broker.log.stream(sid0).next_offset == 1  # rewound: the offset is not used up


async def test_a_broker_whose_lease_ran_out_commits_nothing(broker: Storage) -> None:
    await sql(broker, "UPDATE kafka_brokers SET lease_expires_ms=0 WHERE node_id=1")
    got = [broker.append("t", p, make_batch([b"x"])) for p in (0, 1)]
    assert [await outcome(f) for f in got] == [ErrorCode.not_leader_or_follower] * 2
    assert await ends(broker) == [0, 0]


async def test_a_stale_epoch_guard_refuses_the_whole_commit(broker: Storage) -> None:
    """The guard at the store's seam: commit_object with an epoch one behind is refused with
    the stream named, and writes nothing (no object row, no chunk, end offset unchanged)."""
    sid = broker.stream_id("t", 0)
    epoch = broker.cluster.held[sid]
    me = broker.cluster.me
    chunk = ChunkRow(sid, 0, 0, 999_999, 24, 10, 0)
    stale = LeaderGuard(me.node_id, me.incarnation, {sid: epoch - 1}, broker.meta.for_update)
    with pytest.raises(StreamsFencedError) as e:
        await broker.meta.commit_object(999_999, "wal/x", 100, [chunk], [stale])
    assert e.value.stream_ids == {sid}
    assert await sql(broker, "SELECT count(*) FROM objects WHERE object_id=999999") == [(0,)]
    assert await ends(broker) == [0, 0]
    current = LeaderGuard(me.node_id, me.incarnation, {sid: epoch}, broker.meta.for_update)
    await broker.meta.commit_object(999_999, "wal/x", 100, [chunk], [current])
    assert await ends(broker) == [1, 0]


async def test_delete_records_on_a_partition_led_elsewhere_is_refused(broker: Storage) -> None:
    assert await outcome(broker.append("t", 0, make_batch([b"a", b"b"]))) == 0
    await sql(broker, "UPDATE kafka_partitions SET leader=2, leader_epoch=leader_epoch+1"
                      " WHERE stream_id=?", broker.stream_id("t", 0))
    with pytest.raises(KafkaError) as e:
        await broker.delete_records("t", 0, 1)
    assert e.value.code == ErrorCode.not_leader_or_follower
    assert await sql(broker, "SELECT start_offset FROM streams WHERE stream_id=?",
                     broker.stream_id("t", 0)) == [(0,)]
