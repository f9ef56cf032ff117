"""Reads that wait for the object store while compaction swaps the chunk list underneath.

What must survive: a read returns contiguous chunks starting at the one holding the offset,
whatever the chunk list became while it waited; when the objects it was reading were replaced
and deleted meanwhile, it reads again from the current chunks; a gap is never returned."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from s3stream.log import Chunk, ChunkData, LogStore, ReadRaceError, WalSettings, check_contiguous
from s3stream.metadata import ChunkRow, SqliteMetadataStore
from s3stream.objectstore import MemoryObjectStore
from s3stream.readplan import pieces


class GatedStore(MemoryObjectStore):
    """Range GETs wait at the gate while it is closed; `waiting` is set when one does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        return await super().get_range(key, start, length)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[LogStore, GatedStore, int]]:
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(1)
    store = GatedStore()
    log = LogStore(store, meta, WalSettings(cache_max_bytes=0, readahead_bytes=0))
    await log.open(streams, [])
    sid = streams[0].stream_id
    st = log.stream(sid)
    for i in range(5):  # five WAL-like chunks of 10 offsets, each in its own object
        await store.put(f"wal/{i}", bytes([i]) * 100)
        log._object_keys[i] = f"wal/{i}"
        st.add_chunk(Chunk(i * 10, i * 10 + 9, i, 0, 100, 0))
    st.end_offset = st.next_offset = 50
    yield log, store, sid
    await log.close()
    await meta.close()


def rows(sid: int, *chunks: tuple[int, int, int, int, int]) -> list[ChunkRow]:
    return [ChunkRow(sid, b, last, oid, pos, n, 0) for b, last, oid, pos, n in chunks]


async def compact_first_three(log: LogStore, store: GatedStore, sid: int) -> None:
    """Chunks 0..2 (offsets 0..29) move into one stream object chunk, as compaction does."""
    await store.put("stream/merged", b"".join(bytes([i]) * 100 for i in range(3)))
    old = rows(sid, *((i * 10, i * 10 + 9, i, 0, 100) for i in range(3)))
    log.replace_chunks(rows(sid, (0, 29, 10, 0, 300)), old, {10: "stream/merged"})


async def test_a_read_waiting_on_a_get_does_not_skip_when_chunks_are_swapped(
    env: tuple[LogStore, GatedStore, int],
) -> None:
    log, store, sid = env
    store.gate.clear()
    read = asyncio.create_task(log.read(sid, 20, 10_000))  # from chunk 2 onwards
    await asyncio.wait_for(store.waiting.wait(), 5)  # it waits for chunk 2's GET
    await compact_first_three(log, store, sid)  # the list shrinks from 5 chunks to 3
    store.gate.set()
    got = await asyncio.wait_for(read, 5)
    assert got == [(20, bytes([2]) * 100), (30, bytes([3]) * 100), (40, bytes([4]) * 100)]


async def test_a_read_of_a_deleted_object_reads_the_replacement(
    env: tuple[LogStore, GatedStore, int],
) -> None:
    log, store, sid = env
    store.gate.clear()
    read = asyncio.create_task(log.read_chunks(sid, 20, 150))
    await asyncio.wait_for(store.waiting.wait(), 5)
    await compact_first_three(log, store, sid)
    for i in range(3):  # the GC deletes the replaced objects and forgets them
        await store.delete(f"wal/{i}")
    log.forget_objects([0, 1, 2])
    store.gate.set()
    got = await asyncio.wait_for(read, 5)
    # read again from the current list: the stream object's chunk holds offset 20
    assert [(c.base_offset, c.last_offset) for c in got][:1] == [(0, 29)]
    check_contiguous(got, 20)


def test_contiguity_check() -> None:
    check_contiguous([ChunkData(0, 9, b""), ChunkData(10, 19, b"")], 5)
    with pytest.raises(ReadRaceError):
        check_contiguous([ChunkData(0, 9, b""), ChunkData(11, 19, b"")], 5)  # a gap
    with pytest.raises(ReadRaceError):
        check_contiguous([ChunkData(10, 19, b"")], 5)  # does not hold the offset


async def test_a_catch_up_read_gets_chunks_of_different_objects_concurrently(
    tmp_path: Path,
) -> None:
    """One read of many WAL chunks (one object each) has several range GETs in flight, and
    still returns every chunk in offset order."""

    class Overlapping(MemoryObjectStore):
        def __init__(self) -> None:
            super().__init__()
            self.in_flight = self.most = 0

        async def get_range(self, key: str, start: int, length: int) -> bytes:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            await asyncio.sleep(0.01)
            self.in_flight -= 1
            return await super().get_range(key, start, length)

    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(1)
    store = Overlapping()
    log = LogStore(store, meta, WalSettings(cache_max_bytes=0))
    await log.open(streams, [])
    st = log.stream(streams[0].stream_id)
    for i in range(20):
        await store.put(f"wal/{i}", b"h" * 24 + bytes([i]) * 100)
        log._object_keys[i] = f"wal/{i}"
        st.add_chunk(Chunk(i * 10, i * 10 + 9, i, 24, 100, 0))
    st.end_offset = st.next_offset = 200
    got = await log.read(st.stream_id, 0, 10_000)
    assert got == [(i * 10, bytes([i]) * 100) for i in range(20)]
    assert store.most > 1, "one GET at a time"
    await log.close()
    await meta.close()


async def _ten_wal_objects_of_four_streams(
    meta: SqliteMetadataStore, store: MemoryObjectStore, objects: int = 10, chunk: int = 1000
) -> tuple[Any, Any]:
    """Ten WAL objects (or `objects`) of ~4 KB, each with a 1,000-byte chunk (or `chunk`) of
    each of four streams; the metadata's (streams, chunks) after."""
    await meta.open()
    streams = await meta.create_streams(4)
    writer = LogStore(store, meta, WalSettings(flush_interval_ms=1))
    await writer.open(streams, [])
    def payload(sid: int) -> Callable[[int], bytes]:
        return lambda base: bytes([sid, base]) * (chunk // 2)

    for _ in range(objects):
        futs = [writer.append(s.stream_id, 5, 0, payload(s.stream_id))[1] for s in streams]
        await asyncio.gather(*futs)
    await writer.close()
    return await meta.load()


class Downloads(MemoryObjectStore):
    """Counts range GETs and the bytes they download."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = self.downloaded = 0

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        data = await super().get_range(key, start, length)
        self.gets += 1
        self.downloaded += len(data)
        return data


async def _read_every_stream_back(
    tmp_path: Path, objects: int, chunk: int, settings: WalSettings
) -> tuple[Downloads, int]:
    """Four streams written into `objects` WAL objects (a `chunk`-byte chunk of each per
    object), then each read back whole, in turn, by a cold reader: (its store's counts,
    bytes of all the chunks)."""
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    store = Downloads()
    stream_rows, chunk_rows = await _ten_wal_objects_of_four_streams(meta, store, objects, chunk)
    reader = LogStore(store, meta, settings)
    await reader.open(stream_rows, chunk_rows)
    store.gets = store.downloaded = 0
    for s in stream_rows:
        got = await reader.read(s.stream_id, 0, 1 << 20)
        assert got == [(b, bytes([s.stream_id, b]) * (chunk // 2))
                       for b in range(0, 5 * objects, 5)]
    await reader.close()
    await meta.close()
    return store, sum(c.length for c in chunk_rows)


async def _cold_reader(
    tmp_path: Path, cache: int
) -> tuple[SqliteMetadataStore, Downloads, Any, Any, LogStore]:
    """Ten WAL objects of four streams (`_ten_wal_objects_of_four_streams`) and a reader with
    nothing cached, its store's counts at zero: (meta, store, streams, chunks, reader)."""
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    store = Downloads()
    stream_rows, chunk_rows = await _ten_wal_objects_of_four_streams(meta, store)
    reader = LogStore(store, meta, WalSettings(cache_max_bytes=cache, readahead_bytes=0))
    await reader.open(stream_rows, chunk_rows)
    store.gets = store.downloaded = 0
    return meta, store, stream_rows, chunk_rows, reader


async def test_a_catch_up_of_every_partition_gets_each_wal_object_once(tmp_path: Path) -> None:
    """A WAL object holds a chunk of every partition written in its flush; reading one
    partition's chunk fetches the whole (small) object, so reading every partition back costs
    one GET per WAL object, not one per partition and object; the bytes are the same."""
    store, chunks = await _read_every_stream_back(tmp_path, 10, 1000, WalSettings())
    assert store.gets == 10, f"{store.gets} GETs for 10 WAL objects"
    assert store.downloaded == chunks


async def test_a_cache_too_small_for_whole_objects_reads_each_chunk_once(tmp_path: Path) -> None:
    """What must hold: a catch-up never downloads a byte twice because the cache could not
    keep what a whole-object GET brought. A WAL object is fetched whole (every partition's
    chunk) only when the cache holds 16 such objects; below that, a read fetches its own
    chunks. Here the old rule (objects up to a quarter of the cache fetched whole) fetched the
    same objects again and again as each partition's read evicted the others' chunks."""
    # a quarter of the cache (8,000) spans a whole object; a sixteenth (2,000) does not
    store, chunks = await _read_every_stream_back(
        tmp_path, 10, 1000, WalSettings(cache_max_bytes=32_000, readahead_bytes=0)
    )
    assert store.downloaded == chunks, store.downloaded


async def test_one_read_fetches_whole_objects_only_within_its_share(tmp_path: Path) -> None:
    """Each WAL object (1,000 bytes: four streams' 250-byte chunks) is within a sixteenth of
    the cache, but one stream's read spans 40 of them: fetching them all whole brought 4x its
    bytes into a cache that kept a third of them, and every other stream's read fetched the
    evicted ones whole again (in a catch-up of 100 partitions, 14x the bytes served). Now the
    objects one read fetches whole stay within that sixteenth in all, and an object is
    fetched whole only while none of its chunks is cached: what is downloaded twice is at most
    that sixteenth per read (other streams' chunks of it, evicted before their reads came)."""
    store, chunks = await _read_every_stream_back(
        tmp_path, 40, 250, WalSettings(cache_max_bytes=16_000, readahead_bytes=0)
    )
    assert store.downloaded <= chunks + 4 * (16_000 // 16), store.downloaded  # was 112,000


async def test_a_fetch_of_every_partition_at_once_gets_each_wal_object_once(
    tmp_path: Path,
) -> None:
    """A consumer's fetch reads many partitions at once. Their reads are planned before any
    of their GETs starts, and a WAL object holds each partition's chunk back to back: a read
    that needs the chunk stored right after (or before) one a planned GET will bring widens
    that GET instead of making its own. With a cache too small to fetch objects whole, the
    four partitions' reads make one GET per WAL object between them (40 before: one per
    partition and object), and no byte is downloaded twice."""
    meta, store, stream_rows, chunk_rows, reader = await _cold_reader(tmp_path, 32_000)
    got = await asyncio.gather(*(reader.read(s.stream_id, 0, 1 << 20) for s in stream_rows))
    for s, chunks in zip(stream_rows, got, strict=True):
        assert chunks == [(b, bytes([s.stream_id, b]) * 500) for b in range(0, 50, 5)]
    assert store.gets == 10, f"{store.gets} GETs for 10 WAL objects"
    assert store.downloaded == sum(c.length for c in chunk_rows)
    assert not reader._inflight and not reader._planned
    await reader.close()
    await meta.close()


async def test_a_read_cancelled_before_its_gets_start_leaves_none_behind(
    env: tuple[LogStore, GatedStore, int],
) -> None:
    """What must survive a fetch cancelled (its connection closed) right after its reads were
    planned: the GETs it registered as coming, whose tasks never ran, are failed and
    forgotten, so a later read of those chunks (or one that waited on them) reads them
    itself instead of waiting forever."""
    log, store, sid = env
    store.gate.clear()  # a GET that starts waits here (and says so)
    first = asyncio.ensure_future(log.read(sid, 0, 300))
    joiner = asyncio.ensure_future(log._read(sid, 0, 300))  # will wait on first's GETs
    await asyncio.sleep(0)  # both planned: the GETs registered, their tasks not run yet
    assert log._inflight
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not store.waiting.is_set(), "a GET started: not the case under test"
    assert not log._inflight and not log._planned
    with pytest.raises(ReadRaceError):  # retriable: the layer above reads again
        await asyncio.wait_for(joiner, 5)
    store.gate.set()
    got = await asyncio.wait_for(log.read(sid, 0, 300), 5)
    assert got == [(i * 10, bytes([i]) * 100) for i in range(3)]


async def test_a_wal_object_holds_its_streams_chunks_in_stream_order(tmp_path: Path) -> None:
    """Appends arrive in any order; the WAL object lays the streams' chunks out by stream id
    (a topic's partitions are consecutive streams), so the chunks of a fetch's partitions lie
    back to back and one GET serves them all."""
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(4)
    writer = LogStore(MemoryObjectStore(), meta, WalSettings(flush_interval_ms=1))
    await writer.open(streams, [])
    futs = [writer.append(s.stream_id, 5, 0, lambda base: b"x" * 100)[1]
            for s in reversed(streams)]
    await asyncio.gather(*futs)
    await writer.close()
    _, chunk_rows = await meta.load()
    assert len({c.object_id for c in chunk_rows}) == 1
    by_position = sorted(chunk_rows, key=lambda c: c.position)
    assert [c.stream_id for c in by_position] == sorted(s.stream_id for s in streams)
    await meta.close()


def test_a_gets_range_is_cut_at_its_chunks_and_the_gaps_between() -> None:
    """What one GET's body is cut into (s3stream.readplan.pieces): each chunk once (a chunk
    named twice, as the run's and as one of the whole object's, is one piece), in position
    order, and the bytes between chunks (of chunks no longer live) as pieces of their own
    that no read is given."""
    assert pieces(24, 124, [(74, 50), (24, 30), (24, 30)]) == [(24, 30), (-1, 20), (74, 50)]
    assert pieces(0, 10, [(2, 3)]) == [(-1, 2), (2, 3), (-1, 5)]
    assert pieces(0, 10, []) == [(-1, 10)]


async def test_a_fetchs_read_aheads_share_the_budget_and_their_gets(tmp_path: Path) -> None:
    """The reads of a fetch of every partition each read ahead, planned with the reads before
    any GET starts: the read-ahead budget (a quarter of the cache) is shared evenly by the
    streams read lately, so every partition's next chunks are cached for its next read (the
    whole budget went to the first partitions, and the others fell behind in the log), and
    the read-aheads' GETs join like the reads' (one per WAL object, not one per partition)."""
    # objects of 4,000 bytes are not fetched whole (a sixteenth is 2,000); the read-ahead
    # budget, 8,000, is 2,000 (two chunks) for each of the four streams
    meta, store, stream_rows, chunk_rows, reader = await _cold_reader(tmp_path, 32_000)
    got = await asyncio.gather(*(reader.read(s.stream_id, 0, 5_000) for s in stream_rows))
    assert [len(chunks) for chunks in got] == [5] * 4
    await asyncio.gather(*reader._ahead.values())
    by_stream: dict[int, list[ChunkRow]] = {}
    for c in chunk_rows:
        by_stream.setdefault(c.stream_id, []).append(c)
    for chunks in by_stream.values():
        cached = [reader.cache.contains((c.object_id, c.position)) for c in chunks]
        assert cached[5:] == [True, True, False, False, False], cached
    assert store.gets == 7, f"{store.gets} GETs: 5 WAL objects read, 2 read ahead"
    assert store.downloaded == 7 * 4_000
    await reader.close()
    await meta.close()


async def test_log_position_names_the_wal_objects_a_read_would_get(tmp_path: Path) -> None:
    """Fetch keeps its partitions together in the log by where their reads would go to the
    store: the first and last WAL objects holding chunks of the read that are neither cached
    nor coming; None when the read is answered from memory or reads stream objects only."""
    meta, _store, stream_rows, chunk_rows, reader = await _cold_reader(tmp_path, 0)
    sid = stream_rows[0].stream_id
    oids = sorted({c.object_id for c in chunk_rows})
    ours = [c for c in chunk_rows if c.stream_id == sid]
    assert reader.log_position(sid, 0, 3_000) == (oids[0], oids[2])
    assert reader.log_position(sid, 7, 1) == (oids[1], oids[1])  # the chunk holding offset 7
    assert reader.log_position(sid, 50, 1_000) is None  # at the end: nothing to read
    reader.cache.max_bytes = 1 << 20
    reader.cache.put((ours[0].object_id, ours[0].position), b"x")
    assert reader.log_position(sid, 0, 3_000) == (oids[1], oids[2])  # the cached one skipped
    for c in ours[1:3]:
        reader._object_keys[c.object_id] = "stream/elsewhere"  # as if stream objects
    assert reader.log_position(sid, 0, 3_000) is None
    await reader.close()
    await meta.close()
