"""Streams on object storage: ordered appends, group-committed WAL objects, chunk reads.

`LogStore` is the facade the broker, compaction and the log cleaner use. Its parts, each with
its share of the contract stated where it is enforced:
- `s3stream.index`: streams and their copy-on-write chunk lists, each object's live extents.
- `s3stream.wal`: `append` (offsets assigned at once, in call order; the future resolves only
  once the data is in a durable object AND committed to the metadata store, and only then does
  the end offset move), group commit, and the failure path (offsets rewound, never reused;
  `on_durable` / `on_failed` called synchronously before any future resolves).
- `s3stream.reader`: `read_chunks` on a snapshot of the chunk list, contiguous whole chunks,
  read again from a fresh snapshot when a swap raced it; a gap is never returned.
- `s3stream.cache`: the LRU of chunk bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from s3stream.cache import ChunkCache
from s3stream.index import Chunk, Stream, UnknownStreamError, wake_readers
from s3stream.metadata import ChunkRow, CommitAttachment, SqliteMetadataStore, StreamRow
from s3stream.objectstore import ObjectStore
from s3stream.reader import (
    READ_ATTEMPTS,
    READ_CONCURRENCY,
    ChunkData,
    OffsetOutOfRangeError,
    ReaderMixin,
    ReadRaceError,
    check_contiguous,
)
from s3stream.stats import LogStats
from s3stream.wal import (
    Carried,
    ProducerBatch,
    StreamFencedError,
    StreamWriteError,
    WalMixin,
    WalSettings,
)

__all__ = [  # the names others import from here
    "READ_ATTEMPTS",
    "READ_CONCURRENCY",
    "Chunk",
    "ChunkCache",
    "ChunkData",
    "LogStore",
    "OffsetOutOfRangeError",
    "ProducerBatch",
    "ReadRaceError",
    "Stream",
    "StreamFencedError",
    "StreamWriteError",
    "UnknownStreamError",
    "WalSettings",
    "check_contiguous",
    "now_ms",
]


class LogStore(WalMixin, ReaderMixin):
    def __init__(
        self, objects: ObjectStore, meta: SqliteMetadataStore, settings: WalSettings
    ) -> None:
        self.objects = objects
        self.meta = meta
        self.settings = settings
        self.streams: dict[int, Stream] = {}
        # the WAL's chunks (the tail) within half of it: see s3stream.cache
        self.cache = ChunkCache(settings.cache_max_bytes, settings.cache_max_bytes // 2)
        self._object_keys: dict[int, str] = {}
        # (position, length) of the live chunks of each object, every stream's: a read of one
        # stream's chunk in a small WAL object fetches the whole object (see ReaderMixin._begin)
        self._object_chunks: dict[int, set[tuple[int, int]]] = {}
        self._init_wal()
        self._init_reader()
        self.flushes = 0
        self.stats = LogStats()  # WAL flushes (the cache counts its own hits), for metrics
        # producer bookkeeping, called synchronously (see s3stream.wal)
        self.on_durable: Callable[[int, ProducerBatch, int, int], None] | None = None
        self.on_failed: Callable[[set[int]], None] | None = None
        self.commit_attachments: Callable[[list[Carried]], Sequence[CommitAttachment]] | None
        self.commit_attachments = None  # what a flush's commit carries besides the chunks
        # guards of every change to given streams (WAL commits, compaction, retention), e.g.
        # that this writer still leads them; None: changes are not guarded
        self.guards: Callable[[Collection[int]], Sequence[CommitAttachment]] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self, streams: Iterable[StreamRow], chunks: Iterable[ChunkRow]) -> None:
        for s in streams:
            self.add_stream(s)
        self._load_chunks(chunks)
        self._object_keys = await self.meta.object_keys()
        self._flusher = asyncio.create_task(self._flush_loop(), name="wal-flusher")

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        self._closed = True
        self._wake.set()
        self._full.set()
        self._room.set()  # producers waiting for room: their appends now fail (closing)
        if self._flusher is not None:
            await self._flusher
        self.cancel_read_ahead()

    def load_streams(
        self, streams: Iterable[StreamRow], chunks: Iterable[ChunkRow], keys: dict[int, str]
    ) -> None:
        """Start serving streams read from the metadata store (another writer may have written
        them before): their rows, their chunks in offset order, their chunks' object keys.
        A stream already served is replaced (a new `Stream`: appends to the old one fail)."""
        for s in streams:
            self.drop_stream(s.stream_id)
            self.add_stream(s)
        self._object_keys.update(keys)
        self._load_chunks(chunks)

    def guards_for(self, stream_ids: Collection[int]) -> Sequence[CommitAttachment]:
        return self.guards(stream_ids) if self.guards is not None else ()

    def add_stream(self, s: StreamRow) -> Stream:
        st = Stream(s.stream_id, s.start_offset, s.end_offset, s.end_offset)
        self.streams[s.stream_id] = st
        return st

    def drop_stream(self, stream_id: int) -> None:
        st = self.streams.pop(stream_id, None)
        self._served.pop(stream_id, None)
        if st is not None:
            for c in st.chunks:
                self._object_chunks.get(c.object_id, set()).discard((c.position, c.length))
            wake_readers(st)

    # -- objects and retention -------------------------------------------------------------
    async def new_object_id(self) -> int:
        return await self._object_id()

    async def put_object(self, key: str, blob: bytes) -> None:
        await self.objects.put(key, blob)  # retries: the object store's own layer

    async def truncate(self, stream_id: int, start_offset: int) -> int:
        """Move the stream's log start offset forward (durably); drop chunks wholly below."""
        st = self.stream(stream_id)
        start = await self.meta.truncate(stream_id, min(start_offset, st.end_offset),
                                         self.guards_for([stream_id]))
        st.start_offset = max(st.start_offset, start)
        self._drop_chunks_below(st, st.start_offset)
        return st.start_offset

    # -- waiting for data ------------------------------------------------------------------
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
