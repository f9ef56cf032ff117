"""The read path's read-ahead and its sharing of GETs in flight (s3stream.reader).

What must hold: a read that asked for N bytes starts fetching the next N bytes of the stream
into the cache, so the next read finds them there; a read that needs a chunk a GET in flight
will bring waits for that GET instead of making its own; a GET that fails hands its error to
those waiting (they read again, never serve a gap)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.log import Chunk, LogStore, WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import MemoryObjectStore, ObjectNotFoundError


class CountingStore(MemoryObjectStore):
    """Counts range GETs; they wait at the gate while it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[str, int, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        self.gets.append((key, start, length))
        await self.gate.wait()
        return await super().get_range(key, start, length)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[LogStore, CountingStore, int]]:
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(1)
    store = CountingStore()
    settings = WalSettings(cache_max_bytes=1 << 20, readahead_bytes=0)
    log = LogStore(store, meta, settings)
    await log.open(streams, [])
    sid = streams[0].stream_id
    st = log.stream(sid)
    for i in range(6):  # six chunks of 10 offsets and 100 bytes, each in its own object
        await store.put(f"wal/{i}", bytes([i]) * 100)
        log._object_keys[i] = f"wal/{i}"
        st.add_chunk(Chunk(i * 10, i * 10 + 9, i, 0, 100, 0))
    st.end_offset = st.next_offset = 60
    yield log, store, sid
    await log.close()
    await meta.close()


async def settled(log: LogStore) -> None:
    """Every read-ahead asked for has been planned (at the next turn of the loop) and done."""
    while log._ahead or log._ahead_asked:
        await asyncio.sleep(0)
        await asyncio.gather(*log._ahead.values(), return_exceptions=True)


async def test_a_read_fetches_the_next_bytes_it_asked_for_ahead(
    env: tuple[LogStore, CountingStore, int],
) -> None:
    log, store, sid = env
    got = await log.read_chunks(sid, 0, 200)
    assert [c.data for c in got] == [b"\0" * 100, b"\1" * 100]
    await settled(log)
    assert sorted(k for k, _, _ in store.gets) == [f"wal/{i}" for i in range(4)]
    store.gets.clear()
    got = await log.read_chunks(sid, 20, 200)  # what the read-ahead brought: no GET
    assert [c.data for c in got] == [b"\2" * 100, b"\3" * 100]
    await settled(log)
    assert sorted(k for k, _, _ in store.gets) == ["wal/4", "wal/5"]  # the next read-ahead


async def test_reads_of_a_chunk_in_flight_share_its_get(
    env: tuple[LogStore, CountingStore, int],
) -> None:
    log, store, sid = env
    store.gate.clear()
    first = asyncio.ensure_future(log.read_chunks(sid, 0, 100))
    while not store.gets:
        await asyncio.sleep(0)
    second = asyncio.ensure_future(log.read_chunks(sid, 5, 100))
    for _ in range(5):
        await asyncio.sleep(0)
    store.gate.set()
    a, b = await asyncio.gather(first, second)
    assert a == b and a[0].data == b"\0" * 100
    assert [k for k, _, _ in store.gets].count("wal/0") == 1


async def test_a_failed_get_fails_its_waiters_too(
    env: tuple[LogStore, CountingStore, int],
) -> None:
    log, store, sid = env
    store.gate.clear()
    del store.objects["wal/0"]
    first = asyncio.ensure_future(log._read(sid, 0, 100))
    while not store.gets:
        await asyncio.sleep(0)
    second = asyncio.ensure_future(log._read(sid, 0, 100))
    for _ in range(5):
        await asyncio.sleep(0)
    store.gate.set()
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert all(isinstance(r, ObjectNotFoundError) for r in results)
    assert [k for k, _, _ in store.gets].count("wal/0") == 1
    assert not log._inflight


async def test_chunks_fetched_ahead_outlive_chunks_already_served(tmp_path: Path) -> None:
    """A catch-up reads each chunk once: when the cache is full, the chunks its reads have
    served (and sent: the stream was read again) go before the ones its read-aheads fetched
    for the next read (which then makes no GET); the last chunk of a read stays (the next
    read starts in it if the response ended inside it)."""
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    store = CountingStore()
    # read-ahead budget: a quarter of the cache, 200 bytes (two chunks; one each for two readers)
    log = LogStore(store, meta, WalSettings(cache_max_bytes=800, readahead_bytes=0))
    try:
        streams = await meta.create_streams(2)
        await log.open(streams, [])
        a, b = (s.stream_id for s in streams)
        for n, sid in enumerate((a, b)):
            st = log.stream(sid)
            for i in range(4):  # four chunks of 10 offsets and 100 bytes, each in its own object
                oid = n * 10 + i
                await store.put(f"wal/{oid}", bytes([oid]) * 100)
                log._object_keys[oid] = f"wal/{oid}"
                st.add_chunk(Chunk(i * 10, i * 10 + 9, oid, 0, 100, 0))
            st.end_offset = st.next_offset = 40
        await log.read_chunks(a, 0, 200)  # serves a0, a1; reads a2, a3 ahead
        await settled(log)
        await log.read_chunks(b, 0, 300)  # serves b0, b1, b2 (after a's read-ahead); b3 ahead
        await settled(log)
        assert log.cache.size == 800
        # b's next read: what its last one served has been sent (b0, b1 go first from now on)
        assert (await log.read_chunks(b, 30, 100))[0].data == b"\x0d" * 100
        for i in range(4):  # the tail: four chunks the WAL put
            log.cache.put((100, i * 100), b"t" * 100)
        store.gets.clear()
        got = await log.read_chunks(a, 20, 200)
        assert [c.data for c in got] == [b"\2" * 100, b"\3" * 100]
        assert store.gets == []  # what a's read-ahead fetched was still cached
        assert log.cache.contains((12, 0))  # b's last chunk served, kept
        assert not any(log.cache.contains((10 + i, 0)) for i in range(2))  # served: evicted
    finally:
        await log.close()
        await meta.close()

