"""Log compaction for `cleanup.policy=compact` topics, with Kafka's semantics.

For every partition of a compacted topic the cleaner keeps, in the cleanable part of the log,
the latest record of each key and drops the rest:

- Offsets are preserved. A kept batch keeps its base offset and last offset delta (records
  removed from it leave gaps); a batch with no record left is dropped. The rewritten chunks
  tile exactly the offset range of the chunks they replace, so chunk ranges stay contiguous; a
  gap at the end of the range is covered by an empty batch (record count 0, as Kafka keeps for
  producer state) so consumers advance past it. A consumer fetching a removed offset gets the
  next surviving record.
- Cleanable part: the leading run of chunks that live in stream objects (chunks still in WAL
  objects are the "active segment": compaction has not settled them yet) and whose newest
  record is older than `min.compaction.lag.ms`. A chunk's age is that of its newest record,
  so min.compaction.lag.ms is never cut short, and max.compaction.lag.ms may be exceeded by
  up to the time one chunk spans.
- A partition is cleaned when the dirty part (written since the last cleaning) is at least
  `min.cleanable.dirty.ratio` of the cleanable bytes, when its oldest dirty chunk is older than
  `max.compaction.lag.ms`, or when a kept tombstone's delete horizon has passed. Each pass
  rewrites from the log start. The checkpoint (where the dirty part starts) survives
  restarts: the cleaner writes its objects with kind "cleaned", and the leading run of chunks
  in such objects is clean. A partition never cleaned is cleaned on the first pass.
- Tombstones (null value): the first cleaning that keeps one stamps its batch with a delete
  horizon of now + `delete.retention.ms` (KIP-534: attribute bit 6, base timestamp = horizon,
  record timestamps unchanged); a later cleaning after the horizon removes them.
- Keyless records (only possible if written before the topic became compacted) are removed,
  as Kafka's cleaner does; produce refuses them on compacted topics.
- Transactions (broker.txn): only chunks wholly below the last stable offset are cleanable, so
  records of open transactions are never cleaned. Records of aborted transactions are no
  key's latest value: they are removed (and left out of the key map), as Kafka's cleaner
  does. Markers (control batches) are all kept: Kafka drops one only delete.retention.ms
  after its transaction's records are gone; keeping it is always safe (a few bytes each).
- Idempotent producer state lives in the metadata store (`kafka_producer_batches`), not in the log,
  so no batch is kept only for it; kept batches keep producer id, epoch and base sequence.
- Memory: the key -> latest offset map holds 16-byte BLAKE2b digests of keys (Kafka's
  SkimpyOffsetMap uses MD5 the same way), at most `max_keys`; it takes whole chunks from the
  dirty part until full and the pass cleans only up to there. Batches are streamed chunk by
  chunk; output is written in objects of at most `object_max_bytes`.

Safety: the new chunks replace the old ones in one metadata transaction that deletes exactly
the old chunk rows (stream, base offset, object id) or fails; if compaction, retention,
DeleteRecords or a topic deletion changed any of them meanwhile, the pass is abandoned and its
new objects are deleted (nobody ever referenced them). The cleaner deletes no data: replaced
objects become unreferenced and s3stream's delayed garbage collection removes them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from crc32c import crc32c

from broker.cluster.node import ClusterNode
from broker.engine import Topic
from broker.protocol.recordcodec import DELETE_HORIZON_BIT, RawRecord, decode_raw, encode_records
from broker.protocol.records import TRANSACTIONAL_BIT, BatchHeader, iter_headers, read_header
from broker.txn.index import AbortedTxn
from broker.txn.partitions import TxnLog
from s3stream import walformat
from s3stream.log import Chunk, LogStore, UnknownStreamError
from s3stream.metadata import ChunkRow, CommitInDoubtError, MetadataError, ObjectRow
from s3stream.objectstore import ObjectNotFoundError

log = logging.getLogger(__name__)

CLEANED_KIND = "cleaned"  # objects table kind of what the cleaner writes: its checkpoint
BYTES_PER_KEY = 144  # measured: a 16-byte digest -> offset entry of a Python dict
_MAX_DELTA = 2**31 - 1


@dataclass(frozen=True)
class CleanerSettings:
    backoff_ms: int = 15_000
    max_keys: int = (128 * 1024 * 1024) // BYTES_PER_KEY
    chunk_max_bytes: int = 1024 * 1024
    object_max_bytes: int = 64 * 1024 * 1024


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


class OffsetMap:
    """Key digest -> offset of the latest record with that key, for at most `capacity` keys."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._map: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._map)

    def fits(self, digests: set[bytes]) -> bool:
        """Whether adding these keys keeps the map within capacity."""
        return len(self._map) + sum(1 for d in digests if d not in self._map) <= self.capacity

    def add_chunk(self, entries: list[tuple[bytes, int]], first: bool) -> bool:
        """Put a whole chunk's (digest, offset) entries if they fit (always the first chunk
        of a pass, so every pass progresses); False, changing nothing, if they do not."""
        if not first and not self.fits({d for d, _ in entries}):
            return False
        for d, off in entries:
            self.put(d, off)
        return True

    def put(self, digest: bytes, offset: int) -> None:
        if offset > self._map.get(digest, -1):
            self._map[digest] = offset

    def latest(self, digest: bytes) -> int:
        return self._map.get(digest, -1)


class AbortedBatches:
    """The data batches of aborted transactions: a transactional batch of a producer that
    starts within one of that producer's aborted ranges (first offset, abort marker)."""

    def __init__(self, ranges: Sequence[AbortedTxn] = ()) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for a in ranges:
            self._ranges.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))

    def __contains__(self, h: BatchHeader) -> bool:
        if h.is_control or not h.attributes & TRANSACTIONAL_BIT:
            return False
        return any(f <= h.base_offset < m for f, m in self._ranges.get(h.producer_id, ()))


NO_ABORTS = AbortedBatches()


@dataclass(frozen=True)
class Policy:
    min_lag_ms: int
    max_lag_ms: int
    min_dirty_ratio: float
    delete_retention_ms: int

    @staticmethod
    def of(topic: Topic) -> Policy:
        c = topic.config
        return Policy(
            c.min_compaction_lag_ms,
            c.max_compaction_lag_ms,
            c.min_cleanable_dirty_ratio,
            c.delete_retention_ms,
        )


@dataclass
class StreamState:
    first_dirty: int  # offsets below it were cleaned by the last pass
    next_horizon: int | None  # earliest delete horizon of a kept tombstone


@dataclass
class CleanerStats:
    streams_cleaned: int = 0
    records_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    abandoned: int = 0
    bytes_read: int = 0  # chunk bytes read to build key maps and to filter


# ------------------------------------------------------------------------------------------
# Pure parts: which chunks, which records
# ------------------------------------------------------------------------------------------
def cleanable_chunks(
    chunks: Sequence[Chunk], settled_objects: set[int], max_timestamp: int
) -> list[Chunk]:
    """The leading, contiguous run of chunks in settled (stream) objects whose newest record
    is at or before `max_timestamp`."""
    out: list[Chunk] = []
    for c in chunks:
        if c.object_id not in settled_objects or c.max_timestamp > max_timestamp:
            break
        if out and c.base_offset != out[-1].last_offset + 1:
            break
        out.append(c)
    return out


def clean_due(
    cleanable: Sequence[Chunk], state: StreamState | None, policy: Policy, now_ms: int
) -> bool:
    """Kafka's triggers: dirty ratio, max compaction lag, a passed tombstone horizon."""
    if state is None:
        return True
    if state.next_horizon is not None and now_ms >= state.next_horizon:
        return True
    dirty = [c for c in cleanable if c.last_offset >= state.first_dirty]
    if not dirty:
        return False
    total = sum(c.length for c in cleanable)
    ratio = sum(c.length for c in dirty) / total if total else 1.0
    return ratio >= policy.min_dirty_ratio or dirty[0].max_timestamp <= now_ms - policy.max_lag_ms


@dataclass(frozen=True)
class Filtered:
    data: bytes | None  # the batch to keep (None: drop it)
    changed: bool
    removed: int
    horizon: int | None  # delete horizon of kept tombstones


def filter_batch(
    buf: bytes | bytearray | memoryview,
    h: BatchHeader,
    offsets: OffsetMap,
    now_ms: int,
    delete_retention_ms: int,
    aborted: AbortedBatches = NO_ABORTS,
) -> Filtered:
    """Kafka's retention rule for one batch: keep a record if it has a key, no later record
    has the same key, and it is not a tombstone whose delete horizon has passed; a batch of an
    aborted transaction goes whole; a control batch (a marker) stays."""
    original = bytes(memoryview(buf)[h.position : h.position + h.size])
    if h.is_control:
        return Filtered(original, False, 0, None)
    if h in aborted:
        return Filtered(None, True, h.record_count, None)
    if h.record_count == 0:  # an empty filler of an earlier pass: placed anew if needed
        return Filtered(None, True, 0, None)
    records = decode_raw(buf, h)
    has_horizon = bool(h.attributes & DELETE_HORIZON_BIT)
    expired = has_horizon and h.base_timestamp <= now_ms
    keep: list[RawRecord] = []
    for r in records:
        if r.key is None:
            continue
        if offsets.latest(key_digest(r.key)) > h.base_offset + r.offset_delta:
            continue
        if r.value is None and expired:
            continue
        keep.append(r)
    removed = len(records) - len(keep)
    if not keep:
        return Filtered(None, True, removed, None)
    tombstones = any(r.value is None for r in keep)
    if not removed and tombstones == has_horizon:
        return Filtered(original, False, 0, h.base_timestamp if has_horizon else None)
    # the max timestamp of what is kept (LogAppendTime batches: the append time, as it was)
    max_ts = h.max_timestamp if h.log_append_time else max(r.timestamp for r in keep)
    if tombstones:
        horizon = h.base_timestamp if has_horizon else now_ms + delete_retention_ms
        data = encode_records(h, keep, h.compression, horizon, True, max_ts)
        return Filtered(data, True, removed, horizon)
    base_ts = keep[0].timestamp if has_horizon else h.base_timestamp
    data = encode_records(h, keep, h.compression, base_ts, False, max_ts)
    return Filtered(data, True, removed, None)


def chunk_keys(
    data: bytes | bytearray, aborted: AbortedBatches = NO_ABORTS
) -> list[tuple[bytes, int]]:
    """(key digest, offset) of every keyed record of a chunk, in offset order (records of
    aborted transactions are nobody's latest value)."""
    entries: list[tuple[bytes, int]] = []
    for h in iter_headers(data):
        if h.is_control or h.record_count == 0 or h in aborted:
            continue
        for r in decode_raw(data, h):
            if r.key is not None:
                entries.append((key_digest(r.key), h.base_offset + r.offset_delta))
    return entries


def filter_chunk(
    data: bytes | bytearray, offsets: OffsetMap, now_ms: int, delete_retention_ms: int,
    aborted: AbortedBatches = NO_ABORTS,
) -> list[tuple[BatchHeader, Filtered]]:
    """filter_batch for every batch of a chunk."""
    return [
        (h, filter_batch(data, h, offsets, now_ms, delete_retention_ms, aborted))
        for h in iter_headers(data)
    ]


def empty_batch(base_offset: int, last_offset: int, timestamp: int) -> bytes:
    """A v2 batch holding no record that spans [base_offset, last_offset] (Kafka retains such
    batches after cleaning; clients move their position past them)."""
    after_crc = struct.pack(
        ">hiqqqhii", 0, last_offset - base_offset, timestamp, timestamp, -1, -1, -1, 0
    )
    head = struct.pack(">qiib", base_offset, len(after_crc) + 9, -1, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


# ------------------------------------------------------------------------------------------
# Writing the cleaned range
# ------------------------------------------------------------------------------------------
@dataclass
class _RangeWriter:
    """Lays kept batches into new chunks that tile [first, last] exactly (each chunk of at
    most chunk_max_bytes unless one batch is larger) and the chunks into stream objects."""

    log: LogStore
    stream_id: int
    first: int
    last: int
    settings: CleanerSettings
    objects: list[ObjectRow] = field(default_factory=list)
    rows: list[ChunkRow] = field(default_factory=list)
    _chunk: list[bytes] = field(default_factory=list)
    _chunk_base: int = -1
    _chunk_size: int = 0
    _chunk_ts: int = -1
    _next_offset: int = -1
    _ready: list[tuple[int, int, bytes, int]] = field(default_factory=list)  # base, last, data, ts
    _ready_size: int = 0

    def __post_init__(self) -> None:
        self._chunk_base = self.first
        self._next_offset = self.first

    async def add(self, batch: bytes, base: int, last: int, max_ts: int) -> None:
        if self._chunk and self._chunk_size + len(batch) > self.settings.chunk_max_bytes:
            await self._close_chunk(base - 1)
            self._chunk_base = base
        self._chunk.append(batch)
        self._chunk_size += len(batch)
        self._chunk_ts = max(self._chunk_ts, max_ts)
        self._next_offset = last + 1

    async def finish(self, fallback_ts: int) -> None:
        """Close the last chunk at `last`. A tail without records gets empty batches (stamped
        `fallback_ts` if the chunk has no other batch); a chunk holding no record has max
        timestamp -1, so time lookups and time retention pass over it."""
        start = self._next_offset
        while start <= self.last:
            end = min(self.last, start + _MAX_DELTA)
            ts = self._chunk_ts if self._chunk_ts >= 0 else fallback_ts
            self._chunk.append(empty_batch(start, end, ts))
            start = end + 1
        await self._close_chunk(self.last)
        await self._write_object()

    async def _close_chunk(self, last: int) -> None:
        data = b"".join(self._chunk)
        self._ready.append((self._chunk_base, last, data, self._chunk_ts))
        self._ready_size += len(data)
        self._chunk, self._chunk_size, self._chunk_ts = [], 0, -1
        if self._ready_size >= self.settings.object_max_bytes:
            await self._write_object()

    async def _write_object(self) -> None:
        if not self._ready:
            return
        ready, self._ready, self._ready_size = self._ready, [], 0
        object_id = await self.log.new_object_id()
        blob, entries = await asyncio.to_thread(
            walformat.encode,
            object_id,
            [(self.stream_id, base, last, data) for base, last, data, _ in ready],
        )
        key = f"stream/{self.stream_id}/{ready[0][0]:020d}-{object_id}"
        await self.log.put_object(key, blob)
        self.objects.append(ObjectRow(object_id, key, len(blob), CLEANED_KIND, _now_ms()))
        for e, (_b, _l, _d, ts) in zip(entries, ready, strict=True):
            self.rows.append(
                ChunkRow(
                    self.stream_id, e.base_offset, e.last_offset, object_id, e.position,
                    e.length, ts,
                )
            )


# ------------------------------------------------------------------------------------------
# The cleaner
# ------------------------------------------------------------------------------------------
class CleanerStorage(Protocol):
    """What the cleaner needs of the s3stream engine (broker.storage.Storage) that runs it."""

    topics: dict[str, Topic]
    log: LogStore
    txns: TxnLog  # open transactions and aborted ranges of the partitions it serves
    cluster: ClusterNode


class LogCleaner:
    def __init__(self, storage: CleanerStorage, settings: CleanerSettings) -> None:
        self.storage = storage
        self.log = storage.log
        self.settings = settings
        self.state: dict[int, StreamState] = {}
        self._cleaned: set[int] = set()  # ids of objects the cleaner wrote (kind "cleaned")

    async def run_once(self, now_ms: int | None = None) -> CleanerStats:
        """One pass over every partition of every compacted topic."""
        stats = CleanerStats()
        now = _now_ms() if now_ms is None else now_ms
        self._cleaned = {o.object_id for o in await self.log.meta.objects(CLEANED_KIND)}
        settled = {o.object_id for o in await self.log.meta.objects("stream")} | self._cleaned
        compacted = []
        for topic in list(self.storage.topics.values()):
            if topic.config.compact:
                compacted.append(topic)
        live = {sid for topic in compacted for sid in topic.streams}
        self.state = {sid: s for sid, s in self.state.items() if sid in live}
        for topic in compacted:
            for sid in list(topic.streams):
                try:
                    await self.clean_stream(sid, Policy.of(topic), settled, now, stats)
                except (MetadataError, ObjectNotFoundError, UnknownStreamError) as e:
                    stats.abandoned += 1
                    log.info("cleaning %s stream %d abandoned: %r", topic.name, sid, e)
        return stats

    async def clean_stream(
        self, sid: int, policy: Policy, settled: set[int], now: int, stats: CleanerStats
    ) -> bool:
        """Clean one stream if due; returns whether a cleaned range was committed."""
        st = self.log.streams.get(sid)
        # a stream is served once its transactions are rebuilt: its aborted ranges are known
        if st is None or not self.storage.cluster.serves(sid):
            return False
        chunks = [c for c in st.chunks if c.last_offset >= st.start_offset]  # a snapshot
        lso = self.storage.txns.index.lso(sid, st.end_offset)  # open transactions: not cleaned
        cleanable = [
            c for c in cleanable_chunks(chunks, settled, now - policy.min_lag_ms)
            if c.last_offset < lso
        ]
        if not cleanable:
            return False
        state = self.state.get(sid)
        if state is None:
            state = self._recover_state(cleanable, policy, now)
            if state is not None:
                self.state[sid] = state
        if not clean_due(cleanable, state, policy, now):
            return False
        end = cleanable[-1].last_offset + 1
        first_dirty = cleanable[0].base_offset if state is None else state.first_dirty
        first_dirty = min(max(first_dirty, cleanable[0].base_offset), end)
        aborted = AbortedBatches(self.storage.txns.index.aborted(sid, 0, end))
        offsets, clean_end = await self._build_offset_map(
            [c for c in cleanable if c.last_offset >= first_dirty], stats, aborted
        )
        clean_end = max(clean_end, first_dirty) if clean_end > 0 else end
        old = [c for c in cleanable if c.last_offset < clean_end]
        writer = _RangeWriter(self.log, sid, old[0].base_offset, old[-1].last_offset,
                              self.settings)
        changed = False
        removed = 0
        horizons: list[int] = []
        try:
            for c in old:
                data = await self.log.chunk_data(c)
                stats.bytes_read += len(data)
                # CPU work off the event loop (the GIL still switches every few ms), so
                # produce and fetch keep their latency while a partition is cleaned
                filtered = await asyncio.to_thread(
                    filter_chunk, data, offsets, now, policy.delete_retention_ms, aborted
                )
                for h, f in filtered:
                    changed |= f.changed
                    removed += f.removed
                    if f.horizon is not None:
                        horizons.append(f.horizon)
                    if f.data is not None:
                        kept = read_header(f.data)
                        await writer.add(f.data, h.base_offset, h.last_offset, kept.max_timestamp)
            if changed:
                await writer.finish(max(c.max_timestamp for c in old))
        except Exception:
            await self._discard(writer.objects)
            raise
        next_state = StreamState(clean_end, min(horizons) if horizons else None)
        if not changed:  # objects written for a large range that needed nothing: unused
            await self._discard(writer.objects)
            self.state[sid] = next_state
            return False
        old_rows = [
            ChunkRow(sid, c.base_offset, c.last_offset, c.object_id, c.position, c.length,
                     c.max_timestamp)
            for c in old
        ]
        try:
            await self.log.meta.replace_chunks(writer.objects, writer.rows, old_rows,
                                               self.log.guards_for([sid]))
        except MetadataError as e:
            # refused: nobody ever referenced the new objects, delete them now. In doubt: the
            # store undoes the commit later and its garbage collection takes them then.
            if not isinstance(e, CommitInDoubtError):
                await self._discard(writer.objects)
            raise
        self.log.replace_chunks(writer.rows, old_rows, {o.object_id: o.key for o in writer.objects})
        self.state[sid] = next_state
        before = sum(c.length for c in old)
        after = sum(r.length for r in writer.rows)
        stats.streams_cleaned += 1
        stats.records_removed += removed
        stats.bytes_before += before
        stats.bytes_after += after
        log.info(
            "cleaned stream %d offsets %d..%d: %d records removed, %d -> %d bytes",
            sid, old[0].base_offset, old[-1].last_offset, removed, before, after,
        )
        return True

    def _recover_state(
        self, cleanable: list[Chunk], policy: Policy, now: int
    ) -> StreamState | None:
        """The checkpoint of a stream this process has not cleaned yet: the leading run of
        chunks in objects the cleaner wrote is clean (each pass rewrites from the log start).
        Delete horizons are not known without reading: every tombstone kept before is due by
        now + delete.retention.ms, so a pass is due then. None: never cleaned."""
        end = -1
        for c in cleanable:
            if c.object_id not in self._cleaned:
                break
            end = c.last_offset + 1
        return None if end < 0 else StreamState(end, now + policy.delete_retention_ms)

    async def _discard(self, objects: list[ObjectRow]) -> None:
        """Delete objects this pass wrote and no chunk row ever referred to."""
        for o in objects:
            try:
                await self.log.objects.delete(o.key)
            except Exception:
                log.warning("could not delete unused cleaner object %s", o.key)

    async def _build_offset_map(
        self, dirty: list[Chunk], stats: CleanerStats, aborted: AbortedBatches
    ) -> tuple[OffsetMap, int]:
        """The map of the dirty chunks that fit (whole chunks, at least one), and the end of
        the last chunk taken (0 when there is no dirty chunk)."""
        offsets = OffsetMap(self.settings.max_keys)
        end = 0
        for c in dirty:
            data = await self.log.chunk_data(c)
            stats.bytes_read += len(data)
            if not await asyncio.to_thread(_map_chunk, offsets, data, end == 0, aborted):
                break
            end = c.last_offset + 1
        return offsets, end


def _map_chunk(
    offsets: OffsetMap, data: bytes | bytearray, first: bool, aborted: AbortedBatches
) -> bool:
    return offsets.add_chunk(chunk_keys(data, aborted), first)


def _now_ms() -> int:
    return int(time.time() * 1000)
