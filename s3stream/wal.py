"""The write path: pending appends, group-committed WAL objects, the failure/rewind path.

Contract (what the broker relies on):
- `append` is synchronous: it assigns the next offsets of the stream immediately, in call order,
  and returns a future that resolves to the base offset once the bytes are in a durable object
  AND the metadata commit that makes them part of the stream has succeeded (`_commit`).
- Only then does the stream's end offset move, so readers never see undurable data.
- Up to `max_inflight_flushes` WAL objects are uploaded at once, but their metadata commits
  happen in the order the objects were cut (`_run_flush`): end offsets move forward
  contiguously and futures resolve in log order; an ack never overtakes an earlier flush.
  At a flush's commit turn, the flushes cut after it whose objects are already uploaded and
  need nothing redone commit in the same metadata transaction (`_followers`), all or none;
  if that transaction fails, the flush commits alone as it would have, and the others
  at their own turns.
- If a flush fails for good, every not yet durable append of the affected streams (in that
  flush, in later flushes still in flight, and pending) fails with `StreamWriteError` and those
  streams' next offset goes back to their durable end offset (`_fail`): an offset is never
  handed out twice (AutoMQ #3033 is the bug not to have). A chunk is committed only if it
  starts exactly at its stream's end offset (`_committable`).
- Memory is bounded: a flush takes at most `flush_max_bytes` of the pending appends (and at
  least one), and `room()` waits while the bytes appended and not yet committed or failed
  exceed `unflushed_limit` (`flush_max_bytes` x (`max_inflight_flushes` + 1)): a producer
  faster than the store waits for it (the broker's Produce handler awaits `room()` before
  appending, so that connection reads nothing more meanwhile) instead of the broker
  holding everything it was sent.
- Listeners see producer bookkeeping synchronously: `on_durable` for every idempotent append
  the moment it is committed, `on_failed` with the streams whose appends failed, before any
  future of theirs resolves (nothing can be checked against a stale view in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from s3stream import walformat
from s3stream.cache import ChunkCache
from s3stream.index import Chunk, IndexMixin, Stream, UnknownStreamError, wake_readers
from s3stream.metadata import (
    ChunkRow,
    CommitAttachment,
    ObjectCommit,
    SqliteMetadataStore,
    StreamsFencedError,
)
from s3stream.objectstore import ObjectStore, put_parts
from s3stream.stats import LogStats, attributed

WAL_PREFIX = "wal/"  # WAL objects' keys: wal/<object id, 16 digits>

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
    # WAL objects between their cut and the end of their commit at once (uploading, or
    # uploaded and waiting for the commit of the one before): 1 is one flush at a time
    max_inflight_flushes: int = 4

    def __post_init__(self) -> None:
        if self.max_inflight_flushes < 1:
            raise ValueError(
                f"max_inflight_flushes must be at least 1, got {self.max_inflight_flushes}"
            )


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
    data: bytes | bytearray | memoryview  # a view: into the request's frame (see _upload)
    max_timestamp: int
    future: asyncio.Future[int]
    producer: ProducerBatch | None
    charge: int  # what it counts for in the WAL's memory bound (see `append`)


Carried = tuple[int, ProducerBatch, int, int]
StreamPart = tuple[int, int, int, bytes | bytearray]  # stream id, base, last offset, bytes


@dataclass(slots=True, eq=False)
class _Flush:
    """The appends of one cut, from the cut until the end of its commit turn."""

    batch: list[_Pending]  # every append cut, in append order
    nbytes: int
    charged: int  # what its appends count for in the memory bound
    began: float
    served: list[_Pending]  # what goes into its object: the appends to streams still served
    guards: Sequence[CommitAttachment] = ()  # taken when its upload starts
    uploaded: _Object | None = None  # once its upload succeeded
    committed: bool = False  # in the transaction of an earlier flush's commit turn


@dataclass(frozen=True, slots=True, eq=False)
class _Object:
    """A WAL object uploaded (durable), not yet committed."""

    object_id: int
    key: str
    size: int
    rows: list[ChunkRow]
    parts: list[StreamPart]  # the per-stream bytes, what the cache keeps once committed
    batch: list[_Pending]  # the appends in it


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
        self._ids_lock = asyncio.Lock()  # first come, first served: ids in the order asked
        # flushes cut and not yet at their commit turn, oldest first
        self._flushing: deque[_Flush] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self._cut_bytes = 0  # bytes of the flushes cut and not done (committed or failed)
        self._charged_frame: tuple[int, int] | None = None  # see `append`
        self._room = asyncio.Event()  # set while below `unflushed_limit`
        self._room.set()

    @property
    def unflushed_limit(self) -> int:
        return self.settings.flush_max_bytes * (self.settings.max_inflight_flushes + 1)

    async def room(self) -> None:
        """Wait until the bytes appended and not yet committed or failed are below
        `unflushed_limit` (at once if they are, or the log is closing)."""
        if self._has_room():
            return
        began = time.monotonic()
        self.stats.room_waits += 1
        try:
            while not self._has_room():
                self._room.clear()
                await self._room.wait()
        finally:
            self.stats.room_wait_seconds += time.monotonic() - began

    @property
    def unflushed_bytes(self) -> int:
        """Bytes appended and not yet committed or failed: pending, or in flushes cut."""
        return self._pending_bytes + self._cut_bytes

    def _has_room(self) -> bool:
        return self._closed or self.unflushed_bytes < self.unflushed_limit

    def _freed(self) -> None:
        """Wake `room()` waiters once the unflushed bytes are below the limit."""
        if self._has_room():
            self._room.set()

    def append(
        self,
        stream_id: int,
        record_count: int,
        max_timestamp: int,
        encode: Callable[[int], bytes | bytearray | memoryview],
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
        charge = len(data)
        if isinstance(data, memoryview):
            # a view into a request's frame keeps all of the frame until it is done (record
            # sets of other partitions, or that failed, included): the first append from a
            # frame counts for the whole frame, those right after it from the same for nothing
            frame = memoryview(data.obj).nbytes if data.obj is not None else charge
            key = (id(data.obj), frame)
            charge = 0 if key == self._charged_frame else max(charge, frame)
            self._charged_frame = key
        self._pending.append(_Pending(
            st, base, base + record_count - 1, data, max_timestamp, fut, producer, charge))
        if not self._pending_bytes:
            self._first_pending_at = time.monotonic()
        self._pending_bytes += charge
        self._wake.set()
        if self._pending_bytes >= self.settings.flush_max_bytes:
            self._full.set()
        return base, fut

    async def _flush_loop(self) -> None:
        """Cut the pending appends into flushes, each uploaded at once by its own task (at
        most `max_inflight_flushes` between cut and commit); each task commits only after the
        one cut before it has committed or failed, so the last one done means all are done."""
        interval = self.settings.flush_interval_ms / 1000
        slots = asyncio.Semaphore(self.settings.max_inflight_flushes)
        last: asyncio.Task[None] | None = None
        while True:
            await self._wake.wait()
            if not self._pending:
                self._wake.clear()
                if self._closed:
                    break
                continue
            # group commit: wait until the oldest pending append has waited `interval` (appends
            # that arrived during earlier flushes have already waited) or the buffer is full
            wait = self._first_pending_at + interval - time.monotonic()
            full = self._pending_bytes >= self.settings.flush_max_bytes
            if wait > 0 and not self._closed and not full:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), wait)
            await slots.acquire()  # appends keep arriving meanwhile: a bigger object
            if not self._pending:  # a failed flush took them while we waited
                slots.release()
                continue
            # the cut and its registration as in flight: no await in between (see `_fail`)
            batch, nbytes, charged = self._cut()
            served = [p for p in batch if self.streams.get(p.stream.stream_id) is p.stream]
            flush = _Flush(batch, nbytes, charged, time.monotonic(), served)
            self._flushing.append(flush)
            last = asyncio.create_task(self._run_flush(flush, last, slots), name="wal-flush")
            # the task holds them now: this frame must not keep a flush's appends (their
            # bytes may be views into request frames) until the next cut
            del batch, served, flush
        if last is not None:  # close: drain every flush in flight
            await asyncio.wait([last])

    def _cut(self) -> tuple[list[_Pending], int, int]:
        """Take the oldest pending appends, up to `flush_max_bytes` (at least one): what a
        producer sent while every flush slot was busy goes into the next objects, not one
        object as large as all of it."""
        limit = self.settings.flush_max_bytes
        n, nbytes, charged = 0, 0, 0
        for p in self._pending:
            if n and nbytes + len(p.data) > limit:
                break
            n += 1
            nbytes += len(p.data)
            charged += p.charge
        batch, self._pending = self._pending[:n], self._pending[n:]
        self._pending_bytes -= charged
        self._cut_bytes += charged
        if self._pending_bytes < limit:
            self._full.clear()
        return batch, nbytes, charged

    async def _run_flush(
        self, f: _Flush, prev: asyncio.Task[None] | None, slots: asyncio.Semaphore
    ) -> None:
        """Upload the flush's object now, alongside earlier flushes still in flight; commit it
        at its turn, once the flush before has committed or failed (unless an earlier turn
        committed it already, see `_commit_turn`). Never raises."""
        try:
            uploaded: _Object | Exception | None = None
            try:
                if f.served:
                    sids = {p.stream.stream_id for p in f.served}
                    f.guards = self.guards(sids) if self.guards else ()
                    # tasks start in the order flushes are cut, so object ids grow with it
                    uploaded = f.uploaded = await self._upload(
                        await self._object_id(), f.served)
            except Exception as e:  # acted on at the commit turn (see `_settle`)
                uploaded = e
            if prev is not None:
                await asyncio.wait([prev])  # returns, never raises, once prev is done
            # the commit turn: every flush cut before this one has committed or failed, so
            # each stream's end offset covers everything durable before this flush's appends
            try:
                if f.committed:  # with an earlier flush (see `_followers`)
                    committed = True
                else:
                    self._flushing.remove(f)  # the oldest: `_fail` sees only those after it
                    committed = await self._settle(f, uploaded)
            except Exception as e:
                log.error("WAL flush of %d appends failed: %r", len(f.batch), e)
                self.stats.wal_flush_failures += 1
                self._fail(f.batch, e)
            else:
                if not committed:  # every append had failed: no object became part of a log
                    self.stats.wal_flush_failures += 1
                    return
                self.stats.wal_flushes += 1  # latency: from the cut until committed, as before
                self.stats.wal_flush_seconds.observe(time.monotonic() - f.began)
                self.stats.wal_flush_bytes.observe(f.nbytes)
        finally:
            self._cut_bytes -= f.charged
            self._freed()
            slots.release()

    async def _settle(self, f: _Flush, uploaded: _Object | Exception | None) -> bool:
        """The commit turn of `f`: commit what of it may still be committed (False when
        nothing may); raises what fails all of it.

        When appends of the uploaded object may no longer be committed (a flush before failed
        them, their stream changed owner or does not continue from them), the rest goes into
        a new object. An object uploaded and never committed has no row in the metadata
        store (`commit_object` inserts it with its chunks, in one transaction): nothing reads
        it, and the GC, which deletes only objects that have a row and no chunk
        (`unreferenced_objects`, s3stream/metadata/maintenance.py), leaves it alone, as it
        does an object whose commit failed."""
        # appends to a stream dropped (or dropped and taken again) since: not this era's
        stale = [p for p in f.batch if self.streams.get(p.stream.stream_id) is not p.stream]
        if stale:
            self._fail(stale, StreamFencedError("the stream changed owner"))
        if isinstance(uploaded, Exception):
            raise uploaded
        batch = self._committable(f.batch)
        if not batch:
            return False
        try:
            if uploaded is not None and _same(batch, uploaded.batch):
                await self._commit_turn(uploaded, f.guards)
            else:
                await self._flush_guarded(batch, f.guards)
        except StreamsFencedError as e:  # commit the others' appends; fail the fenced ones
            log.warning("WAL commit refused for streams %s: %s", sorted(e.stream_ids), e)
            self._fail([p for p in batch if p.stream.stream_id in e.stream_ids], e)
            rest = [p for p in batch if p.stream.stream_id not in e.stream_ids]
            if not rest:
                return False
            await self._flush_guarded(rest, f.guards)
        return True

    async def _commit_turn(self, obj: _Object, guards: Sequence[CommitAttachment]) -> None:
        """Commit the uploaded object of the flush at its commit turn, with its followers
        when there are any; when that fails, the object alone (its failure is the flush's)."""
        followers = self._followers()
        if followers:
            try:
                await self._commit([(obj, guards), *((g.uploaded, g.guards) for g in followers
                                                     if g.uploaded is not None)])
            except Exception as e:  # nothing of it committed: as if never tried
                log.info("WAL group commit of %d objects failed, committing one by one: %r",
                         len(followers) + 1, e)
            else:
                for g in followers:
                    g.committed = True
                    self._flushing.remove(g)
                return
        await self._commit([(obj, guards)])

    def _followers(self) -> list[_Flush]:
        """The flushes right after the one at its commit turn (whose committable appends are
        its whole object) that may commit in the same transaction: uploaded, every append
        in the object, none failed or of a stream no longer served (what `_settle` would
        change). The first that is not stops the list (commits stay in cut order). That
        their chunks continue their streams is the metadata commit's own check."""
        out: list[_Flush] = []
        for g in self._flushing:
            obj = g.uploaded
            if obj is None or not _same(g.batch, obj.batch) or any(
                p.future.done() or self.streams.get(p.stream.stream_id) is not p.stream
                for p in g.batch
            ):
                break
            out.append(g)
        return out

    def _committable(self, batch: list[_Pending]) -> list[_Pending]:
        """The appends of `batch` not failed yet whose stream's run in it starts exactly at
        the stream's end offset and has no gap; the others fail (with what follows them).
        At a commit turn anything else follows offsets that will never be committed."""
        runs: dict[int, list[_Pending]] = {}
        for p in batch:
            if not p.future.done():
                runs.setdefault(p.stream.stream_id, []).append(p)
        for sid, run in runs.items():
            expected = run[0].stream.end_offset
            for p in run:
                if p.base_offset != expected:
                    end = run[0].stream.end_offset
                    err = f"stream {sid}: append at {p.base_offset}, {expected} due (end {end})"
                    self._fail(run, StreamWriteError(err))
                    break
                expected = p.last_offset + 1
        return [p for p in batch if not p.future.done()]

    def _fail(self, batch: list[_Pending], err: Exception) -> None:
        """Fail the batch's appends not done yet, and every later one of the same streams (in
        flushes in flight, not at their commit turn yet, and pending); rewind the streams
        (with StreamFencedError when `err` is one: the stream is no longer this writer's).
        Called only at a commit turn: the streams' end offsets cover every earlier flush."""
        # one failed already rewound its stream then: appends since continue from there
        batch = [p for p in batch if not p.future.done()]
        if not batch:
            return
        streams = {p.stream.stream_id for p in batch}
        later = [
            p
            for f in self._flushing
            for p in f.batch
            if p.stream.stream_id in streams and not p.future.done()
        ]  # they stay in their flush, which drops them at its commit turn (`_committable`)
        later += [p for p in self._pending if p.stream.stream_id in streams]
        self._pending = [p for p in self._pending if p.stream.stream_id not in streams]
        self._pending_bytes = sum(p.charge for p in self._pending)
        self._freed()
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
        async with self._ids_lock:
            if not self._ids:
                first = await self.meta.reserve_object_ids(64)
                self._ids = list(range(first + 63, first - 1, -1))
            return self._ids.pop()

    async def _flush_guarded(
        self, batch: list[_Pending], guards: Sequence[CommitAttachment]
    ) -> None:
        """Write the batch into a new object and commit it (at a commit turn)."""
        await self._commit([(await self._upload(await self._object_id(), batch), guards)])

    async def _upload(self, object_id: int, batch: list[_Pending]) -> _Object:
        """Write the batch's appends, a chunk per stream, into WAL object `object_id`."""
        groups: dict[int, list[_Pending]] = {}
        for p in batch:
            groups.setdefault(p.stream.stream_id, []).append(p)
        parts: list[StreamPart] = []
        # in stream order: a fetch reads a topic's partitions (consecutive streams) together,
        # and the chunks of those of its reads that need this object then lie back to back,
        # one range GET between them (s3stream.reader `_join`)
        for sid, ps in sorted(groups.items()):
            # one bytes per stream: what the cache keeps (a view would keep the whole
            # request frame it points into alive)
            data = ps[0].data if len(ps) == 1 else b"".join(p.data for p in ps)
            if isinstance(data, memoryview):
                data = data.tobytes()
            parts.append((sid, ps[0].base_offset, ps[-1].last_offset, data))
        key = f"{WAL_PREFIX}{object_id:016d}"
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
        return _Object(object_id, key, size, rows, parts, batch)

    async def _commit(self, objs: list[tuple[_Object, Sequence[CommitAttachment]]]) -> None:
        """Make uploaded objects part of their streams, in order, in one metadata transaction
        (at a commit turn): the metadata commit, then for each the index, the cache, the
        producers' bookkeeping and the futures."""
        commits = []
        for obj, guards in objs:
            carried = [
                (p.stream.stream_id, p.producer, p.base_offset, p.last_offset)
                for p in obj.batch
                if p.producer is not None
            ]
            attachments = self.commit_attachments(carried) if self.commit_attachments else ()
            commits.append(ObjectCommit(obj.object_id, obj.key, obj.size, obj.rows,
                                        [*attachments, *guards]))
        lives = await self.meta.commit_objects(commits)
        self.stats.wal_commits += 1
        for (obj, _guards), live in zip(objs, lives, strict=True):
            self._committed(obj, live)

    def _committed(self, obj: _Object, live: set[int]) -> None:
        batch = obj.batch
        now = time.time()
        self._object_keys[obj.object_id] = obj.key
        self.flushes += 1
        # durable and committed: only now do the streams' end offsets move and futures resolve
        for row, (_sid, _b, _l, data) in zip(obj.rows, obj.parts, strict=True):
            st = self.streams.get(row.stream_id)
            if row.stream_id not in live or st is None:
                continue
            self._object_chunks.setdefault(obj.object_id, set()).add((row.position, row.length))
            st.add_chunk(
                Chunk(
                    row.base_offset,
                    row.last_offset,
                    obj.object_id,
                    row.position,
                    row.length,
                    row.max_timestamp,
                )
            )
            st.end_offset = row.last_offset + 1
            st.committed(st.end_offset, now)
            self.cache.put((obj.object_id, row.position), data, tail=True)
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


def _same(a: list[_Pending], b: list[_Pending]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
