"""Reads of one (stream, offset) made once; full reads kept for the fetch that comes back
(s3stream.sharedreads, wired into LogStore.read_chunks).

What must survive: every read still returns the records at its offset, whole and contiguous;
a read that stopped at the log's end is never answered from what was kept (records appended
since are served); a kept read is not served below a log start that moved; a read joined to
one that is cancelled still gets its records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from s3stream.log import LogStore, WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import MemoryObjectStore
from s3stream.reader import OffsetOutOfRangeError
from s3stream.sharedreads import SharedReads

CHUNK = 1000  # bytes of each chunk written (5 records of 200 bytes)


class CountingStore(MemoryObjectStore):
    """Counts range GETs; they wait at `gate` while it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        self.gets += 1
        await self.gate.wait()
        return await super().get_range(key, start, length)


def payload(sid: int, b: int) -> bytes:
    return bytes([sid, b % 256]) * (CHUNK // 2)


async def append(log: LogStore, sid: int, times: int) -> None:
    for _ in range(times):
        await log.append(sid, 5, 0, lambda b: payload(sid, b))[1]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[LogStore, CountingStore, list[int]]]:
    """Two streams, ten 1,000-byte chunks each (one WAL object per flush); a cache of 4,000
    bytes, so reading one whole stream evicts what another read brought."""
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    store = CountingStore()
    settings = WalSettings(flush_interval_ms=1, cache_max_bytes=4000, readahead_bytes=0)
    writer = LogStore(store, meta, settings)
    await writer.open(await meta.create_streams(2), [])
    sids = list(writer.streams)
    for sid in sids:
        await append(writer, sid, 10)
    await writer.close()
    log = LogStore(store, meta, settings)  # cold: an empty cache
    await log.open(*await meta.load())
    yield log, store, sids
    await log.close()
    await meta.close()


def offsets(got: list[tuple[int, bytes]]) -> list[int]:
    return [base for base, _ in got]


Read = asyncio.Future[list[tuple[int, bytes]]]


async def two_reads(log: LogStore, store: CountingStore, sid: int, first_bytes: int,
                    second_bytes: int) -> tuple[Read, Read, int]:
    """A read of offset 0 held at the store's gate, then a second one of the same offset:
    (first, second, the GETs made before the second began)."""
    store.gate.clear()
    first = asyncio.ensure_future(log.read(sid, 0, first_bytes))
    await asyncio.sleep(0.01)
    gets = store.gets
    second = asyncio.ensure_future(log.read(sid, 0, second_bytes))
    await asyncio.sleep(0.01)
    return first, second, gets


async def test_concurrent_reads_of_one_offset_get_the_bytes_once(
    env: tuple[LogStore, CountingStore, list[int]],
) -> None:
    log, store, (sid, _) = env
    first, second, gets = await two_reads(log, store, sid, 3 * CHUNK, 2 * CHUNK)  # less: joins
    assert store.gets == gets  # waiting on the first read's GETs, none of its own
    store.gate.set()
    a, b = await first, await second
    assert a == b == [(o, payload(sid, o)) for o in (0, 5, 10)]
    assert log.shared_reads.joined == 1


async def test_a_full_read_is_kept_for_the_fetch_that_comes_back(
    env: tuple[LogStore, CountingStore, list[int]],
) -> None:
    log, store, (sid, other) = env
    a = await log.read(sid, 0, 2 * CHUNK)  # stops at max_bytes: kept
    await log.read(other, 0, 1 << 20)  # to the log's end: not kept; evicts the cache
    assert not log.cache.contains((log.stream(sid).chunks[0].object_id,
                                   log.stream(sid).chunks[0].position))
    gets = store.gets
    assert await log.read(sid, 0, 2 * CHUNK) == a
    assert store.gets == gets  # from what was kept, not the store
    assert await log.read(sid, 0, 4 * CHUNK) != a  # asks for more than was kept: a read
    assert store.gets > gets


async def test_a_read_that_reached_the_end_is_not_kept(
    env: tuple[LogStore, CountingStore, list[int]],
) -> None:
    log, _, (sid, _) = env
    assert offsets(await log.read(sid, 40, 1 << 20)) == [40, 45]  # 2,000 bytes: fit
    await append(log, sid, 1)  # offsets 50..54
    after = await log.read(sid, 40, 1 << 20)
    assert offsets(after) == [40, 45, 50]  # the appended chunk is served, not a kept answer


async def test_a_kept_read_is_not_served_below_a_moved_log_start(
    env: tuple[LogStore, CountingStore, list[int]],
) -> None:
    log, _, (sid, _) = env
    await log.read(sid, 0, 2 * CHUNK)  # kept
    await log.truncate(sid, 10)
    with pytest.raises(OffsetOutOfRangeError):
        await log.read(sid, 0, 2 * CHUNK)


async def test_a_read_joined_to_a_cancelled_one_reads_itself(
    env: tuple[LogStore, CountingStore, list[int]],
) -> None:
    log, store, (sid, _) = env
    owner, joiner, _ = await two_reads(log, store, sid, 2 * CHUNK, 2 * CHUNK)
    owner.cancel()
    await asyncio.sleep(0.01)
    store.gate.set()
    got = await asyncio.wait_for(joiner, 5)
    assert got == [(o, payload(sid, o)) for o in (0, 5)]
    with pytest.raises(asyncio.CancelledError):
        await owner


async def test_kept_reads_stay_within_their_byte_budget() -> None:
    shared: SharedReads[bytes] = SharedReads(max_bytes=250)
    runs = 0

    async def run(n: int) -> bytes:
        nonlocal runs
        runs += 1
        return bytes(n)

    def read(stream: int, n: int) -> Awaitable[bytes]:
        return shared.read((stream, 0), 100, lambda: run(n), len, lambda _: True, lambda _: 9)

    for stream in range(3):  # 100 bytes each: the third drops the first (least recent)
        await read(stream, 100)
    assert shared.size == 200 and runs == 3
    await read(2, 100)
    assert runs == 3  # kept
    await read(0, 100)
    assert runs == 4  # dropped: read again
    await read(9, 300)
    assert shared.size <= 250  # larger than the budget: never kept


async def test_a_kept_read_goes_once_the_stream_is_read_past_it() -> None:
    """A consumer that got a kept read's records asks next from its end (or from inside it,
    when its response was cut): the kept read is not asked for again and goes. A read of the
    stream elsewhere (another consumer, before it or beyond its end) leaves it."""
    shared: SharedReads[tuple[int, int]] = SharedReads(max_bytes=1000)
    runs: list[tuple[int, int]] = []

    async def read(offset: int, last: int) -> tuple[int, int]:
        async def run() -> tuple[int, int]:
            runs.append((offset, last))
            return offset, last

        return await shared.read((1, offset), 10, run, lambda _: 10, lambda _: True,
                                 lambda r: r[1])

    await read(100, 199)  # kept
    await read(50, 99)  # another consumer, before it: kept too
    await read(300, 399)  # beyond its end: both stay
    assert shared.size == 30
    await read(100, 199)
    assert len(runs) == 3  # answered by the kept read; 50's ends right before it: gone
    assert sorted(shared._kept) == [(1, 100), (1, 300)]
    await read(200, 299)  # right after 100's: it goes
    assert len(runs) == 4 and sorted(shared._kept) == [(1, 200), (1, 300)]
    await read(100, 199)
    assert len(runs) == 5  # read again
    await read(150, 249)  # inside 100's range: 100 goes
    assert (1, 100) not in shared._kept and (1, 200) in shared._kept
