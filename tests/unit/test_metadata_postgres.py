"""PostgreSQL connection loss: the store reconnects, a failed call is retriable, a commit
whose COMMIT was in doubt is taken back, and the log layer loses nothing acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import pytest

from s3stream.log import LogStore, StreamWriteError, WalSettings
from s3stream.metadata import (
    ChunkRow,
    CommitInDoubtError,
    MetadataStore,
    MetadataUnavailableError,
    open_metadata_store,
)
from s3stream.metadata.backend import Connection, Cursor
from s3stream.objectstore import MemoryObjectStore
from tests.pg import PgCluster


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[MetadataStore]:
    s = open_metadata_store(pg_url)
    await s.open()
    yield s
    await s.close()


async def test_server_restart_between_two_calls(
    store: MetadataStore, pg_cluster: PgCluster
) -> None:
    (s,) = await store.create_streams(1)
    pg_cluster.restart()
    # the old connection is dead; the call notices, connects again and runs
    streams, _ = await store.load()
    assert [x.stream_id for x in streams] == [s.stream_id]
    await store.commit_object(1, "wal/1", 1, [ChunkRow(s.stream_id, 0, 4, 1, 0, 1, 0)])
    pg_cluster.restart()
    assert await store.reserve_object_ids(1) == 1  # a write transaction after a restart


async def test_calls_fail_retriably_while_the_server_is_down(
    store: MetadataStore, pg_cluster: PgCluster
) -> None:
    (s,) = await store.create_streams(1)
    pg_cluster.stop()
    try:
        for _ in range(2):  # every call tries to connect again, and says it may be retried
            with pytest.raises(MetadataUnavailableError) as e:
                await store.commit_object(1, "wal/1", 1, [ChunkRow(s.stream_id, 0, 4, 1, 0, 1, 0)])
            assert e.value.retriable
    finally:
        pg_cluster.start()
    assert await store.commit_object(
        1, "wal/1", 1, [ChunkRow(s.stream_id, 0, 4, 1, 0, 1, 0)]) == {s.stream_id}
    streams, _ = await store.load()
    assert streams[0].end_offset == 5


class LoseCommit(Connection):
    """Wraps the store's connection: the next COMMIT is lost with the connection, after
    (`committed=True`) or before it reached the server."""

    def __init__(self, inner: Connection, committed: bool) -> None:
        self.inner = inner
        self.committed = committed

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        if sql == "COMMIT":
            if self.committed:
                self.inner.execute(sql, params)
            self.inner.close()  # the server aborts an open transaction of a closed session
            raise MetadataUnavailableError("injected: connection lost during COMMIT")
        return self.inner.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        return self.inner.executemany(sql, rows)

    def close(self) -> None:
        self.inner.close()

    def transaction_id(self) -> str | None:
        return self.inner.transaction_id()


@pytest.mark.parametrize("committed", [True, False])
async def test_commit_in_doubt_is_taken_back(store: MetadataStore, committed: bool) -> None:
    (s, t) = await store.create_streams(2)
    await store.commit_object(1, "wal/1", 1, [ChunkRow(s.stream_id, 0, 9, 1, 0, 1, 0)])
    store._db = LoseCommit(store.db, committed)
    rows = [ChunkRow(s.stream_id, 10, 19, 2, 0, 1, 0), ChunkRow(t.stream_id, 0, 4, 2, 1, 1, 0)]
    with pytest.raises(CommitInDoubtError) as e:
        await store.commit_object(2, "wal/2", 1, rows)
    assert e.value.retriable
    # whether or not it committed, the next call finds the metadata as if it had not
    streams, chunks = await store.load()
    assert {x.stream_id: x.end_offset for x in streams} == {s.stream_id: 10, t.stream_id: 0}
    assert [(c.stream_id, c.base_offset) for c in chunks] == [(s.stream_id, 0)]
    # so the log layer's retry, from the offsets it rewound to, passes the guard
    await store.commit_object(3, "wal/3", 1, [ChunkRow(s.stream_id, 10, 19, 3, 0, 1, 0),
                                              ChunkRow(t.stream_id, 0, 4, 3, 1, 1, 0)])
    streams, chunks = await store.load()
    assert {x.stream_id: x.end_offset for x in streams} == {s.stream_id: 20, t.stream_id: 5}
    assert [c.object_id for c in chunks] == [1, 3, 3]
    assert store._in_doubt == []


async def test_compaction_in_doubt_keeps_the_old_chunks(store: MetadataStore) -> None:
    from s3stream.metadata import ObjectRow

    (s,) = await store.create_streams(1)
    old = [ChunkRow(s.stream_id, 0, 9, 1, 0, 1, 0), ChunkRow(s.stream_id, 10, 19, 2, 0, 1, 0)]
    for c in old:
        await store.commit_object(c.object_id, f"wal/{c.object_id}", 1, [c])
    store._db = LoseCommit(store.db, committed=True)
    with pytest.raises(CommitInDoubtError):
        await store.replace_chunks([ObjectRow(9, "stream/9", 2, "stream", 0)],
                                   [ChunkRow(s.stream_id, 0, 19, 9, 0, 2, 0)], old)
    _, chunks = await store.load()
    assert chunks == old
    assert [o.object_id for o in await store.unreferenced_objects(2**62)] == [9]


async def test_log_layer_through_a_server_restart(
    store: MetadataStore, pg_cluster: PgCluster
) -> None:
    """Appends in flight while the metadata database is down fail (retriable); nothing
    acknowledged is lost; the stream goes on from its durable end once the server is back."""
    (s,) = await store.create_streams(1)
    log = LogStore(MemoryObjectStore(), store, WalSettings(flush_interval_ms=1))
    await log.open([s], [])
    try:
        acked = {await asyncio.wait_for(log.append(s.stream_id, 1, 0, lambda b: b"%d" % b)[1], 5)
                 for _ in range(3)}
        pg_cluster.stop()
        try:
            _, fut = log.append(s.stream_id, 1, 0, lambda b: b"lost")
            with pytest.raises(StreamWriteError):
                await asyncio.wait_for(fut, 30)
        finally:
            pg_cluster.start()
        assert log.stream(s.stream_id).next_offset == 3  # rewound: the offset is handed out again
        for _ in range(3):
            acked.add(await asyncio.wait_for(
                log.append(s.stream_id, 1, 0, lambda b: b"%d" % b)[1], 10))
        assert acked == set(range(6))
        data = await log.read(s.stream_id, 0, 1 << 20)
        assert b"".join(d for _, d in data) == b"012345"
    finally:
        await log.close()
    streams, chunks = await store.load()
    assert streams[0].end_offset == 6 and len(chunks) == 6
