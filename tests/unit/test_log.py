"""The log's invariants: ack and visibility only after durability; offsets never reused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.log import LogStore, StreamWriteError, WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import MemoryObjectStore
from tests.faults import FaultyStore


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[LogStore, FaultyStore, int]]:
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(1)
    store = FaultyStore(MemoryObjectStore())
    log = LogStore(store, meta, WalSettings(flush_interval_ms=1))
    await log.open(streams, [])
    yield log, store, streams[0].stream_id
    await log.close()
    await meta.close()


def data(n: int) -> bytes:
    return bytes([n % 256]) * 10


async def test_ack_and_visibility_wait_for_durability(
    env: tuple[LogStore, FaultyStore, int],
) -> None:
    log, store, sid = env
    store.stall.clear()  # the object store hangs
    base, fut = log.append(sid, 3, 0, lambda b: data(b))
    assert base == 0
    await asyncio.sleep(0.05)
    assert not fut.done(), "acknowledged before the object was durable"
    assert log.stream(sid).end_offset == 0
    assert await log.read(sid, 0, 1 << 20) == [], "visible before durable"
    store.stall.set()
    assert await asyncio.wait_for(fut, 5) == 0
    assert log.stream(sid).end_offset == 3
    assert await log.read(sid, 0, 1 << 20) == [(0, data(0))]


async def test_failed_flush_rewinds_and_never_reuses_offsets(
    env: tuple[LogStore, FaultyStore, int],
) -> None:
    log, store, sid = env
    _, ok = log.append(sid, 2, 0, data)
    assert await asyncio.wait_for(ok, 5) == 0
    store.fail_all_puts = True
    futs = [log.append(sid, 1, 0, data)[1] for _ in range(5)]
    for f in futs:
        with pytest.raises(StreamWriteError):
            await asyncio.wait_for(f, 5)
    st = log.stream(sid)
    assert st.end_offset == 2 and st.next_offset == 2  # the failed tail was dropped
    store.fail_all_puts = False
    base, again = log.append(sid, 1, 0, data)
    assert base == 2 and await asyncio.wait_for(again, 5) == 2
    chunks = await log.read(sid, 0, 1 << 20)
    assert [c[0] for c in chunks] == [0, 2]


async def test_transient_put_errors_are_retried(tmp_path: Path) -> None:
    from s3stream.objectstore import RetryingObjectStore, RetryPolicy

    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(1)
    faulty = FaultyStore(MemoryObjectStore())
    faulty.fail_puts = 2  # two 503s, then fine: retried by the object store's retry layer
    log = LogStore(
        RetryingObjectStore(faulty, RetryPolicy(base_delay=0.01)),
        meta,
        WalSettings(flush_interval_ms=1),
    )
    await log.open(streams, [])
    _, fut = log.append(streams[0].stream_id, 1, 0, data)
    assert await asyncio.wait_for(fut, 5) == 0
    assert faulty.puts == 1
    await log.close()
    await meta.close()


async def test_metadata_guard_refuses_a_second_commit_of_an_offset(tmp_path: Path) -> None:
    from s3stream.metadata import ChunkRow, OffsetConflictError

    meta = SqliteMetadataStore(tmp_path / "m.db")
    await meta.open()
    (s,) = await meta.create_streams(1)
    row = ChunkRow(s.stream_id, 0, 9, 1, 24, 100, 0)
    await meta.commit_object(1, "wal/1", 200, [row])
    with pytest.raises(OffsetConflictError):
        await meta.commit_object(2, "wal/2", 200, [ChunkRow(s.stream_id, 0, 9, 2, 24, 100, 0)])
    streams, chunks = await meta.load()
    assert streams[0].end_offset == 10 and len(chunks) == 1
    await meta.close()


async def test_catch_up_reads_coalesce_following_chunks(tmp_path: Path) -> None:
    from s3stream.log import Chunk

    class Counting(MemoryObjectStore):
        ranges = 0

        async def get_range(self, key: str, start: int, length: int) -> bytes:
            Counting.ranges += 1
            return await super().get_range(key, start, length)

    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(1)
    store = Counting()
    log = LogStore(store, meta, WalSettings(readahead_bytes=250))
    await log.open(streams, [])
    st = log.stream(streams[0].stream_id)
    await store.put("stream/obj", b"".join(bytes([i]) * 100 for i in range(5)))
    log._object_keys[99] = "stream/obj"
    for i in range(5):  # five 100-byte chunks back to back in one object
        st.add_chunk(Chunk(i * 10, i * 10 + 9, 99, i * 100, 100, 0))
    st.end_offset = st.next_offset = 50
    first = await log.read(st.stream_id, 0, 1)
    assert first == [(0, bytes([0]) * 100)] and Counting.ranges == 1
    assert await log.read(st.stream_id, 10, 1) == [(10, bytes([1]) * 100)]
    assert Counting.ranges == 1  # chunk 1 came with chunk 0's GET (budget 250 bytes)
    assert await log.read(st.stream_id, 25, 1) == [(20, bytes([2]) * 100)]
    assert Counting.ranges == 2
    everything = await log.read(st.stream_id, 0, 10_000)
    assert [b for b, _ in everything] == [0, 10, 20, 30, 40]
    await log.close()
    await meta.close()


def test_group_chunks_respects_the_size_limit() -> None:
    from s3stream.compaction import group_chunks
    from s3stream.metadata import ChunkRow

    cs = [ChunkRow(1, i, i, 1, 0, n, 0) for i, n in enumerate([40, 40, 40, 200, 10])]
    assert [[c.base_offset for c in g] for g in group_chunks(cs, 100)] == [[0, 1], [2], [3], [4]]
