"""Compaction: WAL objects (many streams each) become stream objects (one stream each).

A stream object holds a run of contiguous offsets of one stream, up to
`stream_object_max_bytes`, cut into chunks of about `chunk_max_bytes` (consecutive WAL chunks
merged, none split): each chunk is an entry of the object's index and a chunk row of its own,
so a read fetches about one chunk (plus read-ahead), never the whole object.

The planner is pure: given the WAL objects and their live chunks it decides which objects to
rewrite and which stream objects to build. The executor reads the WAL objects, writes the stream
objects, swaps the chunk index in one metadata transaction, and only later (after a grace delay
that lets in-flight reads finish) deletes objects no chunk refers to any more. A crash at any
point leaves either the old chunks or the new ones in the index, never a mix and never a loss:
stream objects written but not committed are unreferenced garbage; WAL objects whose chunks
moved are deleted on a later pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from s3stream import walformat
from s3stream.index import by_stream
from s3stream.log import LogStore
from s3stream.metadata import ChunkRow, CommitInDoubtError, MetadataError, ObjectRow
from s3stream.stats import attributed

log = logging.getLogger(__name__)
# WAL objects whose chunks one metadata call looks up: the WAL's commits run on the same
# connection, and a run over 5,000 objects (16 partitions at 2,000 records/s, 30 s) held it
# 0.24 s in one call
LOOKUP_OBJECTS = 500


@dataclass(frozen=True)
class CompactionSettings:
    interval_ms: int = 30_000
    min_age_ms: int = 10_000  # leave the newest WAL objects alone (tail reads hit the cache)
    max_bytes_per_run: int = 64 * 1024 * 1024  # held in memory by one pass
    stream_object_max_bytes: int = 64 * 1024 * 1024
    chunk_max_bytes: int = 1024 * 1024  # index granularity inside a stream object
    gc_delay_ms: int = 30_000


@dataclass(frozen=True)
class StreamObjectPlan:
    stream_id: int
    chunks: list[ChunkRow]  # contiguous offsets, in order

    @property
    def base_offset(self) -> int:
        return self.chunks[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.chunks[-1].last_offset


@dataclass(frozen=True)
class CompactionPlan:
    wal_objects: list[ObjectRow]
    stream_objects: list[StreamObjectPlan]


def choose_wal_objects(wal: list[ObjectRow], now_ms: int, s: CompactionSettings) -> list[ObjectRow]:
    """The oldest WAL objects (a prefix by id, so each stream's chunks in them are a
    contiguous run) that are old enough, within the byte budget (at least one)."""
    chosen: list[ObjectRow] = []
    total = 0
    for o in sorted(wal, key=lambda o: o.object_id):
        if o.created_ms > now_ms - s.min_age_ms:
            break
        if chosen and total + o.size > s.max_bytes_per_run:
            break
        chosen.append(o)
        total += o.size
    return chosen


def plan_compaction(
    wal: list[ObjectRow], chunks: list[ChunkRow], s: CompactionSettings
) -> CompactionPlan:
    """Group the live chunks of the chosen WAL objects by stream and cut each stream's run into
    stream objects of at most `stream_object_max_bytes` (a chunk is never split)."""
    by_stream: dict[int, list[ChunkRow]] = {}
    for c in sorted(chunks, key=lambda c: (c.stream_id, c.base_offset)):
        by_stream.setdefault(c.stream_id, []).append(c)
    plans: list[StreamObjectPlan] = []
    for sid, run in by_stream.items():
        current: list[ChunkRow] = []
        size = 0
        for c in run:
            if current and (
                size + c.length > s.stream_object_max_bytes
                or c.base_offset != current[-1].last_offset + 1
            ):
                plans.append(StreamObjectPlan(sid, current))
                current, size = [], 0
            current.append(c)
            size += c.length
        if current:
            plans.append(StreamObjectPlan(sid, current))
    return CompactionPlan(wal, plans)


def _plan_served(chosen: list[ObjectRow], chunks: list[ChunkRow], served: set[int],
                 s: CompactionSettings) -> CompactionPlan:
    """The plan for the chunks of the streams this store serves (with several writers on one
    metadata database, each compacts its own; the swap is guarded by `store.guards`)."""
    mine = [c for c in chunks if c.stream_id in served]
    objects = {c.object_id for c in mine}
    return plan_compaction([o for o in chosen if o.object_id in objects], mine, s)


def _stream_object(
    object_id: int, sp: StreamObjectPlan, blobs: dict[int, bytes], chunk_max_bytes: int
) -> tuple[bytes, list[walformat.ChunkEntry], list[list[ChunkRow]]]:
    """The stream object of `sp` from its WAL objects' bytes (`blobs`): consecutive WAL chunks
    merged into chunks of about `chunk_max_bytes`, each an index entry of the object and a
    chunk row, so a read fetches ~1 MiB, not the object. Returns the object, its index
    entries and the WAL chunks of each."""
    groups = group_chunks(sp.chunks, chunk_max_bytes)
    parts: list[tuple[int, int, int, bytes | bytearray]] = [
        (
            sp.stream_id,
            g[0].base_offset,
            g[-1].last_offset,
            b"".join(memoryview(blobs[c.object_id])[c.position : c.position + c.length]
                     for c in g),
        )
        for g in groups
    ]
    blob, entries = walformat.encode(object_id, parts)
    return blob, entries, groups


def group_chunks(chunks: list[ChunkRow], max_bytes: int) -> list[list[ChunkRow]]:
    """Merge consecutive chunks into groups of at most max_bytes (a chunk is never split):
    the groups become the chunks of the stream object, so readers still fetch ranges of
    about max_bytes instead of whole objects."""
    groups: list[list[ChunkRow]] = []
    size = 0
    for c in chunks:
        if groups and size + c.length <= max_bytes:
            groups[-1].append(c)
            size += c.length
        else:
            groups.append([c])
            size = c.length
    return groups


@dataclass
class CompactionStats:
    wal_objects: int = 0
    stream_objects: int = 0
    bytes: int = 0
    deleted_objects: int = 0


@dataclass
class Compactor:
    store: LogStore
    settings: CompactionSettings
    _unreferenced_since: dict[int, float] = field(default_factory=dict)

    async def run_once(self) -> CompactionStats:
        """Compacts the WAL objects old enough now, in passes of at most max_bytes_per_run
        (what one pass holds in memory: the WAL objects it reads, then one stream object at
        a time), then collects garbage. Bounded: as many passes as the bytes eligible at the
        start need, and none after a pass that compacted nothing."""
        stats = CompactionStats()
        meta = self.store.meta
        now = int(time.time() * 1000)
        wal = await meta.objects("wal")
        eligible = sum(o.size for o in wal if o.created_ms <= now - self.settings.min_age_ms)
        passes = max(1, -(-eligible // self.settings.max_bytes_per_run))
        done: set[int] = set()  # compacted by this run (their rows stay until the GC)
        for i in range(passes):
            if i:
                wal = await meta.objects("wal")
            # objects whose chunks all moved already (this run's, or unreferenced ones the
            # GC has not deleted yet) would take the budget and make nothing
            gone = done | self._unreferenced_since.keys()
            chosen = choose_wal_objects([o for o in wal if o.object_id not in gone], now,
                                        self.settings)
            if not await self._pass(chosen, stats):
                break
            done.update(o.object_id for o in chosen)
        await self._collect_garbage(stats)
        return stats

    async def _pass(self, chosen: list[ObjectRow], stats: CompactionStats) -> bool:
        """Compacts the chosen WAL objects' chunks of the streams this store serves; False
        when there was nothing to compact."""
        if not chosen:
            return False
        meta = self.store.meta
        found: list[ChunkRow] = []
        ids = [o.object_id for o in chosen]
        for k in range(0, len(ids), LOOKUP_OBJECTS):  # WAL commits go between the lookups
            found += await meta.chunks_of_objects(ids[k:k + LOOKUP_OBJECTS])
        # tens of thousands of chunks: planned in a thread, the event loop serves meanwhile
        plan = await asyncio.to_thread(
            _plan_served, chosen, found, set(self.store.streams), self.settings)
        await self._execute(plan, stats)
        return bool(plan.stream_objects)

    async def _execute(self, plan: CompactionPlan, stats: CompactionStats) -> None:
        if not plan.stream_objects:
            return
        meta = self.store.meta
        shares: dict[int, list[tuple[int, float]]] = {}  # object -> its streams' bytes (costs)
        for sp in plan.stream_objects:
            for c in sp.chunks:
                shares.setdefault(c.object_id, []).append((c.stream_id, c.length))
        blobs: dict[int, bytes] = {}
        for o in plan.wal_objects:
            with attributed(shares.get(o.object_id, ())):
                blobs[o.object_id] = await self.store.objects.get(o.key)
        new_objects: list[ObjectRow] = []
        new_chunks: list[ChunkRow] = []
        old_chunks: list[ChunkRow] = []
        for sp in plan.stream_objects:
            object_id = await self.store.new_object_id()
            # thousands of slices joined and a CRC: in a thread, the event loop serves meanwhile
            blob, entries, groups = await asyncio.to_thread(
                _stream_object, object_id, sp, blobs, self.settings.chunk_max_bytes)
            key = f"stream/{sp.stream_id}/{sp.base_offset:020d}-{object_id}"
            await self.store.put_object(key, blob)
            new_objects.append(
                ObjectRow(object_id, key, len(blob), "stream", int(time.time() * 1000))
            )
            new_chunks.extend(
                ChunkRow(
                    sp.stream_id,
                    e.base_offset,
                    e.last_offset,
                    object_id,
                    e.position,
                    e.length,
                    max(c.max_timestamp for c in g),
                )
                for e, g in zip(entries, groups, strict=True)
            )
            old_chunks.extend(sp.chunks)
            stats.bytes += sum(e.length for e in entries)
        guards = self.store.guards_for({c.stream_id for c in old_chunks})
        try:
            await meta.replace_chunks(new_objects, new_chunks, old_chunks, guards)
        except MetadataError as e:
            # refused (e.g. a stream changed leader): nobody referenced the new objects. In
            # doubt: the store undoes the swap later and the garbage collection takes them.
            if not isinstance(e, CommitInDoubtError):
                for o in new_objects:
                    await self.store.objects.delete(o.key)
            raise
        # the index, a stream at a time: each stream's swap is whole, and the event loop serves
        # requests between them (tens of thousands of chunks took ~70 ms of it at once)
        keys = {o.object_id: o.key for o in new_objects}
        for new_of, old_of in by_stream(new_chunks, old_chunks).values():
            self.store.replace_chunks(new_of, old_of, keys)
            await asyncio.sleep(0)
        stats.wal_objects += len(plan.wal_objects)
        stats.stream_objects += len(new_objects)
        log.info(
            "compacted %d WAL objects into %d stream objects (%d bytes)",
            len(plan.wal_objects),
            len(new_objects),
            stats.bytes,
        )

    async def _collect_garbage(self, stats: CompactionStats) -> None:
        """Delete objects that no chunk has referred to for at least the GC delay. Decided
        from the metadata alone (any writer's chunks count), so writers sharing one database
        may all run it: an object is deleted only once no stream references it."""
        meta = self.store.meta
        now = time.monotonic()
        garbage = await meta.unreferenced_objects(int(time.time() * 1000))
        current = {o.object_id for o in garbage}
        self._unreferenced_since = {
            oid: t for oid, t in self._unreferenced_since.items() if oid in current
        }
        due = []
        for o in garbage:
            first = self._unreferenced_since.setdefault(o.object_id, now)
            if now - first >= self.settings.gc_delay_ms / 1000:
                due.append(o)
        for o in due:
            await self.store.objects.delete(o.key)
        if due:
            await meta.forget_objects([o.object_id for o in due])
            self.store.forget_objects([o.object_id for o in due])
            stats.deleted_objects += len(due)
            for o in due:
                self._unreferenced_since.pop(o.object_id, None)
