"""Read replicas (KIP-392, fetch from the closest replica) on shared storage: a broker serves
Fetch, read-only, for partitions another broker leads, from the object store.

Every broker can read every partition: its chunks are rows in the metadata database and its
bytes are objects in the shared store. A read replica of a partition is what this broker
loaded of it: the stream's committed log start and end (its high watermark) and its chunks
from the lowest offset asked for, read in one snapshot of the metadata database. It serves
only what that snapshot holds, i.e. acknowledged records:
- loaded on the first fetch, and again when a fetch asks below what it loaded;
- refreshed when a fetch asks at or past its end, at most every REFRESH_S per stream (also
  while a fetch waits for data, up to its max_wait_ms);
- reloaded from the fetch's offset when a read finds a chunk's object gone (compaction or the
  log cleaner replaced it and the GC deleted it): never a gap, never a stale byte;
- dropped once no fetch used it for IDLE_S (memory stays bounded by the partitions read).

read_committed: a partition that never held transactional data (`kafka_txn_streams`, written
before any transactional batch can be appended, read in the same snapshot) has no open or
aborted transaction: its last stable offset is its high watermark. One that did is refused
(NOT_LEADER_OR_FOLLOWER: the client goes back to the leader), and its leader does not send
read_committed consumers to a replica.

Answers for clients (librdkafka's and the Java client's KIP-392 handling): a partition this
broker does not know, or that was deleted: NOT_LEADER_OR_FOLLOWER; an offset past the end
after a refresh: OFFSET_OUT_OF_RANGE with the replica's high watermark (clients take it, when
the offset is above that mark, as "go back to the leader"); below the log start:
OFFSET_OUT_OF_RANGE (an offset reset, as from the leader).

Not done: the transaction index of a partition with transactions is not built on a replica
(its read_committed consumers stay on the leader); a refresh reads the chunk rows from the
lowest offset fetched since the previous one, so a consumer far behind on a partition whose
other consumers are at its end makes each refresh of it read many rows (bounded by the
partition's chunk count, at most one refresh per REFRESH_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.engine import ReplicaRead
from broker.errors import ErrorCode, KafkaError
from broker.protocol.recordset import RecordSet
from s3stream.log import (
    Chunk,
    ChunkData,
    LogStore,
    OffsetOutOfRangeError,
    ReadRaceError,
    Stream,
    UnknownStreamError,
)
from s3stream.metadata import ChunkRow, MetadataError, SqliteMetadataStore, StreamRow
from s3stream.metadata.base import marks
from s3stream.reader import ReaderMixin

log = logging.getLogger(__name__)

REFRESH_S = 0.15  # a replica stream asked at its end reads the database at most this often
IDLE_S = 60.0  # a replica stream no fetch used for this long is dropped
RELOADS = 3  # reads of one fetch that found objects gone before it answers a storage error
MAX_STREAMS_PER_QUERY = 500  # a fetch's partitions refreshed in one database read, in batches


@dataclass(eq=False)
class _Replica:
    stream: Stream
    transactional: bool
    loaded_from: int  # the chunks cover [loaded_from, end)
    refreshed: float  # monotonic
    used: float  # monotonic
    lowest: int  # the lowest offset asked for since the last refresh
    refreshing: asyncio.Future[None] | None = None
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Loaded:
    row: StreamRow | None  # None: no such live stream
    chunks: list[ChunkRow]
    keys: dict[int, str]
    transactional: bool


class ReplicaReads(ReaderMixin):
    """The read replicas of one broker: read-only streams beside the led ones of `log`
    (sharing its object store, settings and chunk cache, so memory stays within
    cache.max.bytes; chunk keys are unique over the store)."""

    def __init__(
        self,
        log_store: LogStore,
        meta: SqliteMetadataStore,
        serve: Callable[[list[ChunkData], int, int, bool], RecordSet],
    ) -> None:
        self.serve = serve  # the leader's batch checks (broker.storage.serve_batches)
        self.objects = log_store.objects
        self.settings = log_store.settings
        self.cache = log_store.cache
        self.meta = meta
        self.streams: dict[int, Stream] = {}
        self._object_keys: dict[int, str] = {}
        self._object_chunks: dict[int, set[tuple[int, int]]] = {}  # unused: no widening
        self._init_reader()
        self.replicas: dict[int, _Replica] = {}
        self.bytes_served = 0
        self.fetches = 0
        self.refreshes = 0
        self._swept = time.monotonic()
        # refreshes asked for in one turn of the event loop (a fetch's partitions): one read
        self._pending: dict[int, int] = {}
        self._batch: asyncio.Future[None] | None = None

    # -- the database ----------------------------------------------------------------------
    def _query(self, wanted: list[tuple[int, int]]) -> dict[int, _Loaded]:
        """For each (stream id, from offset): its row, its chunks holding offsets at or past
        max(from, log start) in offset order, their objects' keys and whether it ever held
        transactional data, all in one snapshot."""
        out: dict[int, _Loaded] = {}
        with self.meta._txn(read_only=True) as db:
            ids = [sid for sid, _ in wanted]
            rows = {r[0]: StreamRow(*r) for r in db.execute(
                "SELECT stream_id, start_offset, end_offset FROM streams WHERE deleted = 0"
                f" AND stream_id IN ({marks(len(ids))})", ids)}
            txn = {int(s) for (s,) in db.execute(
                f"SELECT stream_id FROM kafka_txn_streams WHERE stream_id IN ({marks(len(ids))})",
                ids)}
            for sid, offset in wanted:
                row = rows.get(sid)
                if row is None:
                    out[sid] = _Loaded(None, [], {}, False)
                    continue
                chunks = [ChunkRow(*r) for r in db.execute(
                    "SELECT stream_id, base_offset, last_offset, object_id, position, length,"
                    " max_timestamp FROM chunks WHERE stream_id = ? AND last_offset >= ?"
                    " ORDER BY base_offset", (sid, max(offset, row.start_offset)))]
                oids = sorted({c.object_id for c in chunks})
                keys = dict(db.execute(
                    f"SELECT object_id, key FROM objects WHERE object_id IN ({marks(len(oids))})",
                    oids).fetchall()) if oids else {}
                out[sid] = _Loaded(row, chunks, keys, sid in txn)
        return out

    async def _refresh(self, wanted: dict[int, int]) -> None:
        """Read these streams again (from the offsets given) and install what was read;
        concurrent refreshes of one stream share one database read."""
        mine: dict[int, asyncio.Future[None]] = {}
        others: list[asyncio.Future[None]] = []
        loop = asyncio.get_running_loop()
        for sid, offset in wanted.items():
            r = self.replicas.get(sid)
            if r is not None and r.refreshing is not None and offset >= r.loaded_from:
                others.append(r.refreshing)
                continue
            mine[sid] = loop.create_future()
            if r is not None:
                r.refreshing = mine[sid]
        try:
            todo = list(mine)
            for i in range(0, len(todo), MAX_STREAMS_PER_QUERY):
                batch = todo[i : i + MAX_STREAMS_PER_QUERY]
                asked = []
                for sid in batch:
                    r = self.replicas.get(sid)
                    frm = wanted[sid] if r is None else min(wanted[sid], r.lowest)
                    asked.append((sid, frm))
                got = await self.meta._run(self._query, asked)
                self.refreshes += 1
                for sid, frm in asked:
                    self._install(sid, frm, got[sid])
        finally:
            for sid, f in mine.items():
                r = self.replicas.get(sid)
                if r is not None and r.refreshing is f:
                    r.refreshing = None
                if not f.done():
                    f.set_result(None)
        for f in others:
            with contextlib.suppress(Exception):
                await asyncio.shield(f)

    def _refresh_soon(self, sid: int, offset: int) -> asyncio.Future[None]:
        """`_refresh` of the stream together with the others asked for in the same turn of
        the event loop (the reads of one fetch start together): one database read."""
        self._pending[sid] = min(offset, self._pending.get(sid, offset))
        if self._batch is None:
            self._batch = asyncio.ensure_future(self._run_batch())
        return self._batch

    async def _run_batch(self) -> None:
        await asyncio.sleep(0)  # the other reads started with this one ask meanwhile
        pending, self._pending, self._batch = self._pending, {}, None
        await self._refresh(pending)

    def _install(self, sid: int, frm: int, got: _Loaded) -> None:
        now = time.monotonic()
        old = self.replicas.get(sid)
        if got.row is None:
            self._drop(sid)
            return
        start, end = got.row.start_offset, got.row.end_offset
        st = Stream(sid, start, end, end)
        st.set_chunks([Chunk(c.base_offset, c.last_offset, c.object_id, c.position, c.length,
                             c.max_timestamp) for c in got.chunks])
        self._object_keys.update(got.keys)
        self.streams[sid] = st
        r = _Replica(st, got.transactional, max(frm, start), now, now, end)
        if old is not None:
            r.used, r.waiters = old.used, old.waiters
            r.refreshing = old.refreshing
            if end > old.stream.end_offset or start != old.stream.start_offset:
                self._wake(old)
        self.replicas[sid] = r

    def _wake(self, r: _Replica) -> None:
        waiters, r.waiters = r.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _drop(self, sid: int) -> None:
        r = self.replicas.pop(sid, None)
        self.streams.pop(sid, None)
        if r is not None:
            self._wake(r)

    def drop(self, sid: int) -> None:
        """Forget a stream (this broker came to lead it, or it was deleted)."""
        self._drop(sid)

    def sweep(self) -> None:
        """Drop the replica streams no fetch used for IDLE_S, and the keys of objects no
        replica stream's chunk references any more."""
        now = time.monotonic()
        if now - self._swept < min(IDLE_S / 4, 10.0):
            return
        self._swept = now
        for sid in [s for s, r in self.replicas.items() if now - r.used > IDLE_S]:
            self._drop(sid)
        live = {c.object_id for st in self.streams.values() for c in st.chunks}
        self._object_keys = {k: v for k, v in self._object_keys.items() if k in live}

    # -- serving ---------------------------------------------------------------------------
    async def _ready(self, sid: int, offset: int) -> _Replica:
        """The stream loaded so that it covers `offset` if committed (refreshed when `offset`
        is at or past its end and the last refresh is REFRESH_S old)."""
        r = self.replicas.get(sid)
        now = time.monotonic()
        if r is not None:
            r.used = now
            r.lowest = min(r.lowest, offset)
        if r is None or offset < r.loaded_from or (
            offset >= r.stream.end_offset and now - r.refreshed >= REFRESH_S
        ):
            await asyncio.shield(self._refresh_soon(sid, offset))
            r = self.replicas.get(sid)
            if r is None:
                raise KafkaError(ErrorCode.not_leader_or_follower,
                                 f"stream {sid} is not known to this read replica")
        return r

    async def serve_read(
        self, sid: int, offset: int, max_bytes: int, committed: bool
    ) -> ReplicaRead:
        """Whole batches from the one holding `offset` (at least one), within max_bytes."""
        self.sweep()
        self.fetches += 1
        for attempt in range(1, RELOADS + 1):
            try:
                r = await self._ready(sid, offset)
            except MetadataError as e:  # the database is out of reach: try the leader
                raise KafkaError(ErrorCode.not_leader_or_follower, repr(e)) from None
            st = r.stream
            if committed and r.transactional:
                raise KafkaError(
                    ErrorCode.not_leader_or_follower,
                    "read_committed fetches of a transactional partition go to its leader",
                )
            if offset < st.start_offset or offset > st.end_offset:
                raise KafkaError(
                    ErrorCode.offset_out_of_range,
                    f"offset {offset} not in [{st.start_offset}, {st.end_offset}] (replica)",
                )
            try:
                chunks: list[ChunkData] = await self.read_chunks(sid, offset, max_bytes)
                data = self.serve(chunks, offset, max_bytes, True)
            except OffsetOutOfRangeError as e:
                raise KafkaError(ErrorCode.offset_out_of_range, str(e)) from None
            except UnknownStreamError:
                raise KafkaError(ErrorCode.not_leader_or_follower) from None
            except ReadRaceError as e:  # objects replaced: read the chunk rows again
                log.info("replica read of stream %d at %d: %s (reloading)", sid, offset, e)
                if attempt == RELOADS:
                    raise KafkaError(ErrorCode.kafka_storage_error, str(e)) from None
                now_r = self.replicas.get(sid)
                if now_r is not None:  # below what it loaded: the next _ready loads again
                    now_r.loaded_from = offset + 1
                continue
            self.bytes_served += len(data)
            return ReplicaRead(data, st.start_offset, st.end_offset)
        raise AssertionError("unreachable")

    async def wait(self, positions: dict[int, int], timeout: float) -> None:
        """Return once one of the streams has data at or past its position, or after
        `timeout` seconds; reads the database again every REFRESH_S meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            if any((r := self.replicas.get(s)) is None or r.stream.end_offset > off
                   for s, off in positions.items()):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            mine = [r for s in positions if (r := self.replicas.get(s)) is not None]
            for r in mine:
                r.waiters.append(fut)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, min(left, REFRESH_S))
            finally:
                for r in mine:
                    with contextlib.suppress(ValueError):
                        r.waiters.remove(fut)
            now = time.monotonic()
            stale = {s: off for s, off in positions.items()
                     if (r := self.replicas.get(s)) is not None
                     and now - r.refreshed >= REFRESH_S and r.refreshing is None}
            if stale:
                for s in stale:
                    self.replicas[s].used = now
                with contextlib.suppress(MetadataError):  # out of reach: wait on, bounded
                    await self._refresh(stale)

    def known(self, sids: Sequence[int]) -> list[int]:
        return [s for s in sids if s in self.replicas]


class ReplicaCollector(Collector):
    def __init__(self, replicas: ReplicaReads) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        r = self.replicas
        yield CounterMetricFamily(
            "floe_fetch_replica_bytes",
            "Record bytes this broker served as a read replica (KIP-392) of partitions led"
            " by other brokers.",
            value=r.bytes_served,
        )
        yield CounterMetricFamily(
            "floe_fetch_replica_reads",
            "Partition reads this broker served as a read replica.",
            value=r.fetches,
        )
        yield CounterMetricFamily(
            "floe_fetch_replica_refreshes",
            "Reads of the metadata database by this broker's read replicas.",
            value=r.refreshes,
        )
