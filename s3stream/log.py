"""Streams on object storage: ordered appends, group-committed WAL objects, chunk reads.

Contract (what the broker relies on):
- `append` is synchronous: it assigns the next offsets of the stream immediately, in call order,
  and returns a future that resolves to the base offset once the bytes are in a durable object
  AND the metadata commit that makes them part of the stream has succeeded.
- Only then does the stream's end offset move, so readers never see undurable data.
- If a flush fails for good, every pending append of the affected streams fails with
  `StreamWriteError` and those streams' next offset goes back to their durable end offset:
  an offset is never handed out twice (AutoMQ #3033 is the bug not to have).
- `read_chunks` returns whole chunks covering `offset` onwards, contiguous: the first holds
  `offset` and each next one starts right after the previous one's last offset. It works on a
  snapshot of the stream's chunk list (compaction and retention swap that list while a read
  waits for the object store) and reads again from a fresh snapshot when an object went away or
  the chunks are not contiguous; a gap is never returned. The layer above knows the record
  format and trims.
- Listeners see producer bookkeeping synchronously: `on_durable` for every idempotent append
  the moment it is committed, `on_failed` with the streams whose appends failed, before any
  future of theirs resolves (nothing can be checked against a stale view in between).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from s3stream import walformat
from s3stream.metadata import ChunkRow, ProducerBatchRow, SqliteMetadataStore, StreamRow
from s3stream.objectstore import ObjectNotFoundError, ObjectStore
from s3stream.stats import LogStats

log = logging.getLogger(__name__)


class StreamWriteError(Exception):
    """The append was not made durable; the caller may retry (Kafka: a retriable error)."""


class UnknownStreamError(KeyError):
    pass


class ReadRaceError(Exception):
    """What a read found is not contiguous, or an object it needed is gone: chunks were swapped
    underneath it. Retriable: read again from a fresh snapshot; never serve what was found."""


class OffsetOutOfRangeError(Exception):
    """The offset is below the stream's log start (retention moved it during the read)."""


READ_ATTEMPTS = 5  # a read that keeps racing chunk swaps gives up (retriable) after this many
READ_CONCURRENCY = 8  # range GETs one read has in flight at once


@dataclass(slots=True)
class Chunk:
    base_offset: int
    last_offset: int
    object_id: int
    position: int
    length: int
    max_timestamp: int


class ChunkData(NamedTuple):
    """One chunk as read: its offset range and its bytes (whole record batches)."""

    base_offset: int
    last_offset: int
    data: bytes


def check_contiguous(chunks: list[ChunkData], offset: int) -> None:
    """Raise ReadRaceError unless the first chunk holds `offset` and each next one starts right
    after the previous one's last offset."""
    if chunks and not chunks[0].base_offset <= offset <= chunks[0].last_offset:
        raise ReadRaceError(
            f"read of {offset} starts at chunk [{chunks[0].base_offset}, {chunks[0].last_offset}]"
        )
    for prev, nxt in itertools.pairwise(chunks):
        if nxt.base_offset != prev.last_offset + 1:
            raise ReadRaceError(
                f"chunk [{nxt.base_offset}, {nxt.last_offset}] follows one ending at"
                f" {prev.last_offset}"
            )


@dataclass(eq=False, slots=True)
class Stream:
    """A stream's state. `chunks` (with `bases`, their base offsets) is copy-on-write: compaction
    and retention assign new lists, never edit one in place; commits only append at the end.
    So a reader may keep `st.chunks` across an await as a consistent snapshot (an index into
    it stays valid), but must never index `st.chunks` again after an await."""

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

    def set_chunks(self, chunks: list[Chunk]) -> None:
        """Replace the chunk list (a new list: snapshots readers hold stay as they were)."""
        self.chunks = chunks
        self.bases = [c.base_offset for c in chunks]


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """What an idempotent append commits with its data: the metadata transaction that makes
    the data part of the log stores it (so sequence checks survive restarts), and `on_durable`
    hands it back; the log does not interpret it."""

    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int


@dataclass(slots=True)
class _Pending:
    stream: Stream
    base_offset: int
    last_offset: int
    data: bytes | bytearray
    max_timestamp: int
    future: asyncio.Future[int]
    producer: ProducerBatch | None


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
        self.hits = 0  # lookups that found the chunk (metrics)
        self.misses = 0
        self._items: OrderedDict[tuple[int, int], bytes | bytearray] = OrderedDict()

    def get(self, key: tuple[int, int]) -> bytes | bytearray | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
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
        # (position, length) of the live chunks of each object, every stream's: a read of one
        # stream's chunk in a small WAL object fetches the whole object (see _fetch)
        self._object_chunks: dict[int, set[tuple[int, int]]] = {}
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._first_pending_at = 0.0
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._ids: list[int] = []
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self.flushes = 0
        self.stats = LogStats()  # WAL flushes (the cache counts its own hits), for metrics
        # producer bookkeeping, called synchronously (see the module docstring)
        self.on_durable: Callable[[int, ProducerBatch, int, int], None] | None = None
        self.on_failed: Callable[[set[int]], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self, streams: Iterable[StreamRow], chunks: Iterable[ChunkRow]) -> None:
        for s in streams:
            self.add_stream(s)
        for c in chunks:
            st = self.streams.get(c.stream_id)
            if st is not None:
                self._object_chunks.setdefault(c.object_id, set()).add((c.position, c.length))
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
        producer: ProducerBatch | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        """Assign `record_count` offsets, encode the data with its base offset, and queue it.

        `producer` is committed in the same metadata transaction as the data, so sequence
        checks survive restarts.
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
            nbytes = self._pending_bytes
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            self._full.clear()
            began = time.monotonic()
            try:
                await self._flush(batch)
            except Exception as e:
                log.error("WAL flush of %d appends failed: %r", len(batch), e)
                self.stats.wal_flush_failures += 1
                self._fail(batch, e)
            else:
                self.stats.wal_flushes += 1
                self.stats.wal_flush_seconds.observe(time.monotonic() - began)
                self.stats.wal_flush_bytes.observe(nbytes)

    def _fail(self, batch: list[_Pending], err: Exception) -> None:
        """Fail the batch and every later pending append of the same streams; rewind them."""
        streams = {p.stream.stream_id for p in batch}
        later = [p for p in self._pending if p.stream.stream_id in streams]
        self._pending = [p for p in self._pending if p.stream.stream_id not in streams]
        self._pending_bytes = sum(len(p.data) for p in self._pending)
        for p in batch + later:
            p.stream.next_offset = p.stream.end_offset
        if self.on_failed is not None:  # before any future resolves: no stale window
            self.on_failed(streams)
        for p in batch + later:
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
        for c in old:
            self._object_chunks.get(c.object_id, set()).discard((c.position, c.length))
        for c in new:
            self._object_chunks.setdefault(c.object_id, set()).add((c.position, c.length))
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
            st.set_chunks(kept)

    def forget_objects(self, object_ids: list[int]) -> None:
        for oid in object_ids:
            self._object_keys.pop(oid, None)
            self._object_chunks.pop(oid, None)

    async def truncate(self, stream_id: int, start_offset: int) -> int:
        """Move the stream's log start offset forward (durably); drop chunks wholly below."""
        st = self.stream(stream_id)
        start = await self.meta.truncate(stream_id, min(start_offset, st.end_offset))
        st.start_offset = max(st.start_offset, start)
        for c in st.chunks:
            if c.last_offset < st.start_offset:
                self._object_chunks.get(c.object_id, set()).discard((c.position, c.length))
        st.set_chunks([c for c in st.chunks if c.last_offset >= st.start_offset])
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
                p.stream.stream_id,
                p.producer.producer_id,
                p.producer.epoch,
                p.producer.first_seq,
                p.producer.last_seq,
                p.base_offset,
                p.last_offset,
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
            self._object_chunks.setdefault(object_id, set()).add((row.position, row.length))
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
            if p.producer is not None and p.stream.stream_id in live and self.on_durable:
                self.on_durable(p.stream.stream_id, p.producer, p.base_offset, p.last_offset)
        for p in batch:
            if p.future.done():
                continue
            if p.stream.stream_id in live:
                p.future.set_result(p.base_offset)
            else:
                p.future.set_exception(UnknownStreamError(p.stream.stream_id))

    # -- reads -----------------------------------------------------------------------------
    async def read(self, stream_id: int, offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """(base offset, bytes) of `read_chunks`."""
        chunks = await self.read_chunks(stream_id, offset, max_bytes)
        return [(c.base_offset, c.data) for c in chunks]

    async def read_chunks(self, stream_id: int, offset: int, max_bytes: int) -> list[ChunkData]:
        """Contiguous chunks from the one holding `offset`, at least one, until `max_bytes` is
        reached; empty when offset is at or past the end. Raises OffsetOutOfRangeError below
        the log start, ReadRaceError when READ_ATTEMPTS snapshots in a row raced a swap."""
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                out = await self._read(stream_id, offset, max_bytes)
                check_contiguous(out, offset)
                return out
            except (ObjectNotFoundError, ReadRaceError) as e:
                # compaction or retention swapped the chunks (and maybe deleted the objects)
                log.info("read of stream %d at %d raced a chunk swap (attempt %d): %r",
                         stream_id, offset, attempt, e)
                if attempt == READ_ATTEMPTS:
                    raise ReadRaceError(str(e)) from e
        raise AssertionError("unreachable")

    async def _read(self, stream_id: int, offset: int, max_bytes: int) -> list[ChunkData]:
        st = self.stream(stream_id)
        chunks, bases = st.chunks, st.bases  # a snapshot: see Stream
        if offset < st.start_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is below the log start {st.start_offset}")
        if offset >= st.end_offset or not chunks:
            return []
        first = max(0, bisect.bisect_right(bases, offset) - 1)
        end, total = first, 0  # the chunks wanted: from the one holding offset to max_bytes
        while end < len(chunks) and (end == first or total < max_bytes):
            total += chunks[end].length
            end += 1
        got = await self._fetch(chunks, first, end)
        return [
            ChunkData(c.base_offset, c.last_offset, got[(c.object_id, c.position)])
            for c in chunks[first:end]
        ]

    def _key(self, object_id: int) -> str:
        key = self._object_keys.get(object_id)
        if key is None:  # the GC deleted the object and forgot it: the chunk was replaced
            raise ObjectNotFoundError(f"object {object_id}")
        return key

    def _extends(self, run: list[Chunk], c: Chunk) -> bool:
        """Whether `c` is stored right after the run in the same object, within the
        read-ahead budget (so one range GET can cover both)."""
        head, last = run[0], run[-1]
        return (
            c.object_id == head.object_id
            and c.position == last.position + last.length
            and c.position + c.length - head.position <= self.settings.readahead_bytes
        )

    async def _fetch(
        self, chunks: list[Chunk], first: int, end: int
    ) -> dict[tuple[int, int], bytes]:
        """The bytes of chunks[first:end] (of a snapshot), by (object id, position): from the
        cache, else by range GETs, each covering a run of chunks stored back to back in one
        object, up to READ_CONCURRENCY of them at once (a catch-up read of WAL chunks needs one
        GET per chunk). The last run reads ahead over the chunks stored after it, within the
        read-ahead budget. A GET in an object whose live chunks span at most the read-ahead
        budget (and a quarter of the cache) covers them all, every stream's: a catch-up of many
        partitions then makes one GET per WAL object, not one per partition and object.
        Everything fetched is cached, so the next read finds it."""
        got: dict[tuple[int, int], bytes] = {}
        runs: list[list[Chunk]] = []
        missed = -2  # index of the last chunk that was not in the cache
        for k in range(first, end):
            c = chunks[k]
            data = self.cache.get((c.object_id, c.position))
            if data is not None:
                got[(c.object_id, c.position)] = bytes(data)  # a copy only if a bytearray
                continue
            if runs and missed == k - 1 and self._extends(runs[-1], c):
                runs[-1].append(c)
            else:
                runs.append([c])
            missed = k
        if runs and missed == end - 1:  # read ahead over what is stored after the last run
            for c in chunks[end:]:
                if self.cache.get((c.object_id, c.position)) is not None or not self._extends(
                    runs[-1], c
                ):
                    break
                runs[-1].append(c)
        limit = asyncio.Semaphore(READ_CONCURRENCY)

        async def get(run: list[Chunk]) -> None:
            oid = run[0].object_id
            lo, hi = run[0].position, run[-1].position + run[-1].length
            others = set(self._object_chunks.get(oid, ()))  # a copy: it is used after the GET
            if others:
                olo, ohi = min(p for p, _ in others), max(p + n for p, n in others)
                budget = min(self.settings.readahead_bytes, self.cache.max_bytes // 4)
                if ohi - olo <= budget and olo <= lo and hi <= ohi:
                    lo, hi = olo, ohi
                else:
                    others = set()
            async with limit:
                blob = await self.objects.get_range(self._key(oid), lo, hi - lo)
            for p, n in others:
                self.cache.put((oid, p), blob[p - lo : p - lo + n])
            for c in run:
                part = blob[c.position - lo : c.position - lo + c.length]
                self.cache.put((oid, c.position), part)
                got[(oid, c.position)] = part

        for r in await asyncio.gather(*(get(r) for r in runs), return_exceptions=True):
            if isinstance(r, BaseException):  # every GET has finished: nothing left running
                raise r
        return got

    async def chunk_data(self, c: Chunk) -> bytes | bytearray:
        """The bytes of one chunk (of a snapshot); ObjectNotFoundError if it was replaced and
        its object deleted meanwhile (take a fresh snapshot and look again)."""
        key = (c.object_id, c.position)
        data = self.cache.get(key)
        if data is None:
            data = await self.objects.get_range(self._key(c.object_id), c.position, c.length)
            self.cache.put(key, data)
        return data

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
