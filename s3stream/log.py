"""Streams on object storage: ordered appends, group-committed WAL objects, chunk reads.

Contract (what the broker relies on):
- `append` is synchronous: it assigns the next offsets of the stream immediately, in call order,
  and returns a future that resolves to the base offset once the bytes are in a durable object
  AND the metadata commit that makes them part of the stream has succeeded.
- Only then does the stream's end offset move, so readers never see undurable data.
- If a flush fails for good, every pending append of the affected streams fails with
  `StreamWriteError` and those streams' next offset goes back to their durable end offset:
  an offset is never handed out twice (AutoMQ #3033 is the bug not to have).
- `read` returns whole chunks (the bytes of one append group) covering `offset` onwards; the
  layer above knows the record format and trims.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from s3stream import walformat
from s3stream.metadata import ChunkRow, ProducerBatchRow, SqliteMetadataStore, StreamRow
from s3stream.objectstore import ObjectNotFoundError, ObjectStore

log = logging.getLogger(__name__)


class StreamWriteError(Exception):
    """The append was not made durable; the caller may retry (Kafka: a retriable error)."""


class UnknownStreamError(KeyError):
    pass


@dataclass(slots=True)
class Chunk:
    base_offset: int
    last_offset: int
    object_id: int
    position: int
    length: int
    max_timestamp: int


@dataclass(eq=False, slots=True)
class Stream:
    stream_id: int
    start_offset: int
    end_offset: int  # durable: every offset below it is committed
    next_offset: int  # assigned: appends in flight extend up to here
    chunks: list[Chunk] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    # (end offset after a commit, wall-clock time of that commit), for freshness figures
    commits: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=65536))

    def commit_time(self, offset: int) -> float | None:
        """When `offset` became durable (None if before this process or out of the window)."""
        i = bisect.bisect_right(self.commits, offset, key=lambda e: e[0])
        return self.commits[i][1] if i < len(self.commits) else None

    def add_chunk(self, c: Chunk) -> None:
        self.chunks.append(c)
        self.bases.append(c.base_offset)

    def chunk_index(self, offset: int) -> int:
        """Index of the chunk holding `offset` (offset must be in [start, end))."""
        return max(0, bisect.bisect_right(self.bases, offset) - 1)


@dataclass(slots=True)
class _Pending:
    stream: Stream
    base_offset: int
    last_offset: int
    data: bytes | bytearray
    max_timestamp: int
    future: asyncio.Future[int]
    producer: tuple[int, int, int, int] | None  # (producer id, epoch, first seq, last seq)


@dataclass(frozen=True)
class WalSettings:
    flush_interval_ms: float = 5.0
    flush_max_bytes: int = 8 * 1024 * 1024
    cache_max_bytes: int = 256 * 1024 * 1024
    readahead_bytes: int = 4 * 1024 * 1024


class ChunkCache:
    """LRU of chunk bytes keyed by (object id, position), bounded by total size."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._items: OrderedDict[tuple[int, int], bytes | bytearray] = OrderedDict()

    def get(self, key: tuple[int, int]) -> bytes | bytearray | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def put(self, key: tuple[int, int], data: bytes | bytearray) -> None:
        if len(data) > self.max_bytes or key in self._items:
            return
        self._items[key] = data
        self.size += len(data)
        while self.size > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.size -= len(old)


class LogStore:
    def __init__(
        self, objects: ObjectStore, meta: SqliteMetadataStore, settings: WalSettings
    ) -> None:
        self.objects = objects
        self.meta = meta
        self.settings = settings
        self.streams: dict[int, Stream] = {}
        self.cache = ChunkCache(settings.cache_max_bytes)
        self._object_keys: dict[int, str] = {}
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._first_pending_at = 0.0
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._ids: list[int] = []
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self.flushes = 0

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self, streams: Iterable[StreamRow], chunks: Iterable[ChunkRow]) -> None:
        for s in streams:
            self.add_stream(s)
        for c in chunks:
            st = self.streams.get(c.stream_id)
            if st is not None:
                st.add_chunk(
                    Chunk(
                        c.base_offset,
                        c.last_offset,
                        c.object_id,
                        c.position,
                        c.length,
                        c.max_timestamp,
                    )
                )
        self._object_keys = await self.meta.object_keys()
        self._flusher = asyncio.create_task(self._flush_loop(), name="wal-flusher")

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        self._closed = True
        self._wake.set()
        self._full.set()
        if self._flusher is not None:
            await self._flusher

    def add_stream(self, s: StreamRow) -> Stream:
        st = Stream(s.stream_id, s.start_offset, s.end_offset, s.end_offset)
        self.streams[s.stream_id] = st
        return st

    def drop_stream(self, stream_id: int) -> None:
        st = self.streams.pop(stream_id, None)
        if st is not None:
            self._wake_readers(st)

    def stream(self, stream_id: int) -> Stream:
        try:
            return self.streams[stream_id]
        except KeyError:
            raise UnknownStreamError(stream_id) from None

    # -- writes ----------------------------------------------------------------------------
    def append(
        self,
        stream_id: int,
        record_count: int,
        max_timestamp: int,
        encode: Callable[[int], bytes | bytearray],
        producer: tuple[int, int, int, int] | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        """Assign `record_count` offsets, encode the data with its base offset, and queue it.

        `producer` (producer id, epoch, first sequence, last sequence) is committed in the same
        metadata transaction as the data, so sequence checks survive restarts.
        Returns (base offset, future resolved with the base offset once durable)."""
        if self._closed:
            raise StreamWriteError("log store is closing")
        st = self.stream(stream_id)
        base = st.next_offset
        data = encode(base)
        st.next_offset = base + record_count
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append(
            _Pending(st, base, base + record_count - 1, data, max_timestamp, fut, producer)
        )
        if not self._pending_bytes:
            self._first_pending_at = time.monotonic()
        self._pending_bytes += len(data)
        self._wake.set()
        if self._pending_bytes >= self.settings.flush_max_bytes:
            self._full.set()
        return base, fut

    async def _flush_loop(self) -> None:
        interval = self.settings.flush_interval_ms / 1000
        while True:
            await self._wake.wait()
            if not self._pending:
                self._wake.clear()
                if self._closed:
                    return
                continue
            # group commit: wait until the oldest pending append has waited `interval` (appends
            # that arrived during the previous flush have already waited) or the buffer is full
            wait = self._first_pending_at + interval - time.monotonic()
            full = self._pending_bytes >= self.settings.flush_max_bytes
            if wait > 0 and not self._closed and not full:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), wait)
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            self._full.clear()
            try:
                await self._flush(batch)
            except Exception as e:
                log.error("WAL flush of %d appends failed: %r", len(batch), e)
                self._fail(batch, e)

    def _fail(self, batch: list[_Pending], err: Exception) -> None:
        """Fail the batch and every later pending append of the same streams; rewind them."""
        streams = {p.stream.stream_id for p in batch}
        later = [p for p in self._pending if p.stream.stream_id in streams]
        self._pending = [p for p in self._pending if p.stream.stream_id not in streams]
        self._pending_bytes = sum(len(p.data) for p in self._pending)
        for p in batch + later:
            p.stream.next_offset = p.stream.end_offset
            if not p.future.done():
                p.future.set_exception(StreamWriteError(f"not made durable: {err!r}"))

    async def new_object_id(self) -> int:
        return await self._object_id()

    async def put_object(self, key: str, blob: bytes) -> None:
        await self.objects.put(key, blob)  # retries: the object store's own layer

    def replace_chunks(
        self, new: list[ChunkRow], old: list[ChunkRow], keys: dict[int, str]
    ) -> None:
        """Apply a committed compaction to the in-memory index."""
        self._object_keys.update(keys)
        gone = {(c.stream_id, c.base_offset, c.object_id) for c in old}
        touched = {c.stream_id for c in old} | {c.stream_id for c in new}
        for sid in touched:
            st = self.streams.get(sid)
            if st is None:
                continue
            kept = [c for c in st.chunks if (sid, c.base_offset, c.object_id) not in gone]
            kept += [
                Chunk(
                    c.base_offset, c.last_offset, c.object_id, c.position, c.length, c.max_timestamp
                )
                for c in new
                if c.stream_id == sid
            ]
            kept.sort(key=lambda c: c.base_offset)
            st.chunks = kept
            st.bases = [c.base_offset for c in kept]

    def forget_objects(self, object_ids: list[int]) -> None:
        for oid in object_ids:
            self._object_keys.pop(oid, None)

    async def truncate(self, stream_id: int, start_offset: int) -> int:
        """Move the stream's log start offset forward (durably); drop chunks wholly below."""
        st = self.stream(stream_id)
        start = await self.meta.truncate(stream_id, min(start_offset, st.end_offset))
        st.start_offset = max(st.start_offset, start)
        kept = [c for c in st.chunks if c.last_offset >= st.start_offset]
        st.chunks = kept
        st.bases = [c.base_offset for c in kept]
        return st.start_offset

    async def _object_id(self) -> int:
        if not self._ids:
            first = await self.meta.reserve_object_ids(64)
            self._ids = list(range(first + 63, first - 1, -1))
        return self._ids.pop()

    async def _flush(self, batch: list[_Pending]) -> None:
        groups: dict[int, list[_Pending]] = {}
        for p in batch:
            groups.setdefault(p.stream.stream_id, []).append(p)
        parts = []
        for sid, ps in groups.items():
            data = ps[0].data if len(ps) == 1 else b"".join(p.data for p in ps)
            parts.append((sid, ps[0].base_offset, ps[-1].last_offset, data))
        object_id = await self._object_id()
        key = f"wal/{object_id:016d}"
        blob, entries = walformat.encode(object_id, parts)
        await self.objects.put(key, blob)  # retries: the object store's own layer
        rows = [
            ChunkRow(
                e.stream_id,
                e.base_offset,
                e.last_offset,
                object_id,
                e.position,
                e.length,
                max(p.max_timestamp for p in groups[e.stream_id]),
            )
            for e in entries
        ]
        producers = [
            ProducerBatchRow(
                p.stream.stream_id, *p.producer[:2], *p.producer[2:], p.base_offset, p.last_offset
            )
            for p in batch
            if p.producer is not None
        ]
        live = await self.meta.commit_object(object_id, key, len(blob), rows, producers)
        self._object_keys[object_id] = key
        self.flushes += 1
        for row, (_sid, _b, _l, data) in zip(rows, parts, strict=True):
            st = self.streams.get(row.stream_id)
            if row.stream_id not in live or st is None:
                continue
            st.add_chunk(
                Chunk(
                    row.base_offset,
                    row.last_offset,
                    object_id,
                    row.position,
                    row.length,
                    row.max_timestamp,
                )
            )
            st.end_offset = row.last_offset + 1
            st.commits.append((st.end_offset, time.time()))
            self.cache.put((object_id, row.position), data)
            self._wake_readers(st)
        for p in batch:
            if p.future.done():
                continue
            if p.stream.stream_id in live:
                p.future.set_result(p.base_offset)
            else:
                p.future.set_exception(UnknownStreamError(p.stream.stream_id))

    # -- reads -----------------------------------------------------------------------------
    async def read(self, stream_id: int, offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Chunks (base offset, bytes) from the one holding `offset`, at least one, until
        `max_bytes` is reached. Empty when offset is at or past the end."""
        try:
            return await self._read(stream_id, offset, max_bytes)
        except ObjectNotFoundError:  # compaction replaced and deleted it meanwhile: once more
            return await self._read(stream_id, offset, max_bytes)

    async def _read(self, stream_id: int, offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        st = self.stream(stream_id)
        if offset >= st.end_offset or not st.chunks:
            return []
        i = st.chunk_index(offset)
        out: list[tuple[int, bytes]] = []
        total = 0
        while i < len(st.chunks) and (not out or total < max_bytes):
            c = st.chunks[i]
            data = self.cache.get((c.object_id, c.position))
            if data is None:
                data = await self._read_ahead(st, i)
            out.append((c.base_offset, bytes(data) if isinstance(data, bytearray) else data))
            total += len(data)
            i += 1
        return out

    async def _read_ahead(self, st: Stream, i: int) -> bytes | bytearray:
        """Read chunk i with one range GET that also covers the following chunks stored right
        after it in the same object (up to the read-ahead budget), caching all of them:
        catch-up readers then find the next chunks in memory."""
        first = st.chunks[i]
        run = [first]
        for c in st.chunks[i + 1 :]:
            prev = run[-1]
            if (
                c.object_id != first.object_id
                or c.position != prev.position + prev.length
                or c.position + c.length - first.position > self.settings.readahead_bytes
                or self.cache.get((c.object_id, c.position)) is not None
            ):
                break
            run.append(c)
        end = run[-1].position + run[-1].length
        blob = await self.objects.get_range(
            self._object_keys[first.object_id], first.position, end - first.position
        )
        for c in run:
            self.cache.put(
                (c.object_id, c.position),
                blob[c.position - first.position : c.position - first.position + c.length],
            )
        return blob[: first.length]

    async def _chunk_bytes(self, c: Chunk) -> bytes | bytearray:
        key = (c.object_id, c.position)
        data = self.cache.get(key)
        if data is None:
            data = await self.objects.get_range(
                self._object_keys[c.object_id], c.position, c.length
            )
            self.cache.put(key, data)
        return data

    def find_chunk_by_time(self, stream_id: int, timestamp: int) -> Chunk | None:
        """The first chunk whose max timestamp is >= timestamp."""
        for c in self.stream(stream_id).chunks:
            if c.max_timestamp >= timestamp:
                return c
        return None

    async def chunk_data(self, c: Chunk) -> bytes | bytearray:
        return await self._chunk_bytes(c)

    # -- waiting for data ------------------------------------------------------------------
    def _wake_readers(self, st: Stream) -> None:
        waiters, st.waiters = st.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_for_append(self, stream_ids: Iterable[int], timeout: float) -> None:
        """Return when any of the streams' end offset moves, or after `timeout` seconds."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        streams = [st for sid in stream_ids if (st := self.streams.get(sid)) is not None]
        for st in streams:
            st.waiters.append(fut)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            for st in streams:
                with contextlib.suppress(ValueError):
                    st.waiters.remove(fut)


def now_ms() -> int:
    return int(time.time() * 1000)
