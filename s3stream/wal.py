"""The write path: pending appends, group-committed WAL objects, the failure/rewind path.

Contract (what the broker relies on):
- `append` is synchronous: it assigns the next offsets of the stream immediately, in call order,
  and returns a future that resolves to the base offset once the bytes are in a durable object
  AND the metadata commit that makes them part of the stream has succeeded (`_flush`).
- Only then does the stream's end offset move, so readers never see undurable data.
- If a flush fails for good, every pending append of the affected streams fails with
  `StreamWriteError` and those streams' next offset goes back to their durable end offset
  (`_fail`): an offset is never handed out twice (AutoMQ #3033 is the bug not to have).
- Listeners see producer bookkeeping synchronously: `on_durable` for every idempotent append
  the moment it is committed, `on_failed` with the streams whose appends failed, before any
  future of theirs resolves (nothing can be checked against a stale view in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from s3stream import walformat
from s3stream.cache import ChunkCache
from s3stream.index import Chunk, IndexMixin, Stream, UnknownStreamError, wake_readers
from s3stream.metadata import (
    ChunkRow,
    CommitAttachment,
    SqliteMetadataStore,
    StreamsFencedError,
)
from s3stream.objectstore import ObjectStore, put_parts
from s3stream.stats import LogStats, attributed

log = logging.getLogger("s3stream.log")  # the name operators' log filters know


class StreamWriteError(Exception):
    """The append was not made durable; the caller may retry (Kafka: a retriable error)."""


class StreamFencedError(StreamWriteError):
    """The append was not made durable because this writer no longer owns the stream (a
    commit guard refused it, or the stream was dropped or taken again since the append):
    the caller should find the stream's new owner (Kafka: NOT_LEADER_OR_FOLLOWER)."""


@dataclass(frozen=True)
class WalSettings:
    flush_interval_ms: float = 5.0
    flush_max_bytes: int = 8 * 1024 * 1024
    cache_max_bytes: int = 256 * 1024 * 1024
    readahead_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """What an idempotent append carries with its data: `commit_attachments` turns the ones of
    a flush into writes of the metadata transaction that makes the data part of the log (so
    sequence checks survive restarts), and `on_durable` hands it back; the log does not
    interpret it."""

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


Carried = tuple[int, ProducerBatch, int, int]


class WalMixin(IndexMixin):
    """The write path of `s3stream.log.LogStore` (which sets these attributes and calls
    `_init_wal`)."""

    objects: ObjectStore
    meta: SqliteMetadataStore
    settings: WalSettings
    cache: ChunkCache
    flushes: int
    stats: LogStats
    on_durable: Callable[[int, ProducerBatch, int, int], None] | None
    on_failed: Callable[[set[int]], None] | None
    # (stream id, what the append carried, base offset, last offset) of a flush's appends
    # that carried something -> what the layer above adds to the flush's commit_object
    commit_attachments: Callable[[list[Carried]], Sequence[CommitAttachment]] | None
    # guards of a change to these streams (WAL commit, compaction, retention): e.g. that the
    # writer still leads them (see CommitAttachment); taken when the flush starts
    guards: Callable[[Collection[int]], Sequence[CommitAttachment]] | None

    def _init_wal(self) -> None:
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._first_pending_at = 0.0
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._ids: list[int] = []
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    def append(
        self,
        stream_id: int,
        record_count: int,
        max_timestamp: int,
        encode: Callable[[int], bytes | bytearray],
        producer: ProducerBatch | None = None,
    ) -> tuple[int, asyncio.Future[int]]:
        """Assign `record_count` offsets, encode the data with its base offset, and queue it.

        `producer` goes with the data to `commit_attachments`, which may make it part of the
        same metadata transaction (the broker stores producer state there).
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
                committed = await self._flush(batch)
            except Exception as e:
                log.error("WAL flush of %d appends failed: %r", len(batch), e)
                self.stats.wal_flush_failures += 1
                self._fail(batch, e)
            else:
                if not committed:  # every append was fenced: no object became part of a log
                    self.stats.wal_flush_failures += 1
                    continue
                self.stats.wal_flushes += 1
                self.stats.wal_flush_seconds.observe(time.monotonic() - began)
                self.stats.wal_flush_bytes.observe(nbytes)

    def _fail(self, batch: list[_Pending], err: Exception) -> None:
        """Fail the batch and every later pending append of the same streams; rewind them
        (with StreamFencedError when `err` is one: the stream is no longer this writer's)."""
        streams = {p.stream.stream_id for p in batch}
        later = [p for p in self._pending if p.stream.stream_id in streams]
        self._pending = [p for p in self._pending if p.stream.stream_id not in streams]
        self._pending_bytes = sum(len(p.data) for p in self._pending)
        for p in batch + later:
            p.stream.next_offset = p.stream.end_offset
        if self.on_failed is not None:  # before any future resolves: no stale window
            self.on_failed(streams)
        fenced = isinstance(err, StreamFencedError | StreamsFencedError)
        for p in batch + later:
            if not p.future.done():
                cls = StreamFencedError if fenced else StreamWriteError
                p.future.set_exception(cls(f"not made durable: {err!r}"))

    async def _object_id(self) -> int:
        if not self._ids:
            first = await self.meta.reserve_object_ids(64)
            self._ids = list(range(first + 63, first - 1, -1))
        return self._ids.pop()

    async def _flush(self, batch: list[_Pending]) -> bool:
        """Write and commit the batch; False when every append in it was fenced."""
        # appends to a stream dropped (or dropped and taken again) since: not this era's
        stale = [p for p in batch if self.streams.get(p.stream.stream_id) is not p.stream]
        if stale:
            self._fail(stale, StreamFencedError("the stream changed owner"))
            batch = [p for p in batch if self.streams.get(p.stream.stream_id) is p.stream]
            if not batch:
                return False
        guards = self.guards({p.stream.stream_id for p in batch}) if self.guards else ()
        try:
            await self._flush_guarded(batch, guards)
        except StreamsFencedError as e:  # commit the others' appends; fail the fenced ones
            log.warning("WAL commit refused for streams %s: %s", sorted(e.stream_ids), e)
            self._fail([p for p in batch if p.stream.stream_id in e.stream_ids], e)
            rest = [p for p in batch if p.stream.stream_id not in e.stream_ids]
            if not rest:
                return False
            await self._flush_guarded(rest, guards)
        return True

    async def _flush_guarded(
        self, batch: list[_Pending], guards: Sequence[CommitAttachment]
    ) -> None:
        groups: dict[int, list[_Pending]] = {}
        for p in batch:
            groups.setdefault(p.stream.stream_id, []).append(p)
        parts = []
        for sid, ps in groups.items():
            data = ps[0].data if len(ps) == 1 else b"".join(p.data for p in ps)
            parts.append((sid, ps[0].base_offset, ps[-1].last_offset, data))
        object_id = await self._object_id()
        key = f"wal/{object_id:016d}"
        # the object as parts, written without joining them where the store can (a local
        # directory: one writev); the per-stream bytes above are what the cache keeps
        blob, size, entries = walformat.encode_parts(object_id, parts)
        with attributed((sid, len(data)) for sid, _b, _l, data in parts):  # cost per stream
            await put_parts(self.objects, key, blob)  # retries: the object store's own layer
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
        carried = [
            (p.stream.stream_id, p.producer, p.base_offset, p.last_offset)
            for p in batch
            if p.producer is not None
        ]
        attachments = self.commit_attachments(carried) if self.commit_attachments else ()
        attachments = [*attachments, *guards]
        live = await self.meta.commit_object(object_id, key, size, rows, attachments)
        self._object_keys[object_id] = key
        self.flushes += 1
        # durable and committed: only now do the streams' end offsets move and futures resolve
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
            wake_readers(st)
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
