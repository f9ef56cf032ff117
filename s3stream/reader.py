"""The read path: snapshot reads of a stream's chunks, read-ahead, concurrent range GETs.

Contract (what the broker relies on):
- `read_chunks` returns whole chunks covering `offset` onwards, contiguous: the first holds
  `offset` and each next one starts right after the previous one's last offset. It works on a
  snapshot of the stream's chunk list (compaction and retention swap that list while a read
  waits for the object store) and reads again from a fresh snapshot when an object went away or
  the chunks are not contiguous (`check_contiguous`); a gap is never returned. The layer above
  knows the record format and trims.
- Only offsets below the stream's durable end offset are read, so undurable data is never served.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import time
from typing import NamedTuple

from s3stream.cache import ChunkCache
from s3stream.index import Chunk, IndexMixin
from s3stream.objectstore import ObjectNotFoundError, ObjectStore, get_parts
from s3stream.readplan import Fetch, Get, InFlight, pieces, span
from s3stream.sharedreads import SharedReads
from s3stream.wal import WAL_PREFIX, WalSettings

log = logging.getLogger("s3stream.log")  # the name operators' log filters know

READ_ATTEMPTS = 5  # a read that keeps racing chunk swaps gives up (retriable) after this many
READ_CONCURRENCY = 8  # range GETs one read has in flight at once
WHOLE_OBJECT_SHARE = 16  # objects up to cache/16 are fetched whole (see `_begin`)
READERS_WINDOW_S = 1.0  # streams read within this long share the read-ahead budget


class ReadRaceError(Exception):
    """What a read found is not contiguous, or an object it needed is gone: chunks were swapped
    underneath it. Retriable: read again from a fresh snapshot; never serve what was found."""


class OffsetOutOfRangeError(Exception):
    """The offset is below the stream's log start (retention moved it during the read)."""


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


def _size(chunks: list[ChunkData]) -> int:
    return sum(len(c.data) for c in chunks)


def _fail(flight: InFlight, e: BaseException) -> None:
    """Hand a GET's failure to whoever waits for it (a cancelled GET: retriable, as a race)."""
    if not isinstance(e, Exception):
        e = ReadRaceError(f"the GET this read waited for stopped: {e!r}")
    flight.parts.set_exception(e)
    flight.parts.exception()  # retrieved: nobody may be waiting


class ReaderMixin(IndexMixin):
    """The read path of `s3stream.log.LogStore` (which sets these attributes and calls
    `_init_reader`)."""

    objects: ObjectStore
    settings: WalSettings
    cache: ChunkCache

    def _init_reader(self) -> None:
        # chunks (object id, position) a GET under way will bring: a read waits for it
        self._inflight: dict[tuple[int, int], InFlight] = {}
        # GETs planned and not started yet, by object id: a read may still widen them
        self._planned: dict[int, list[InFlight]] = {}
        self._ahead: dict[int, asyncio.Future[None]] = {}  # read-ahead under way, by stream
        self._ahead_bytes = 0
        self._recent_reads: dict[int, float] = {}  # stream -> when last read (see _readers)
        self._recent_pruned = 0.0
        # read-aheads asked for in this turn of the event loop (see _read_ahead)
        self._ahead_asked: dict[int, tuple[list[Chunk], int, int]] = {}
        # the chunks each stream's last read served (see _read)
        self._served: dict[int, list[tuple[int, int]]] = {}
        # reads of one (stream, offset) made once; full ones kept for the fetch that comes back
        # within half the cache: what one fetch that comes back asks for (see sharedreads)
        self.shared_reads: SharedReads[list[ChunkData]] = SharedReads(self.cache.max_bytes // 2)

    async def read(self, stream_id: int, offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """(base offset, bytes) of `read_chunks`."""
        chunks = await self.read_chunks(stream_id, offset, max_bytes)
        return [(c.base_offset, c.data) for c in chunks]

    async def read_chunks(self, stream_id: int, offset: int, max_bytes: int) -> list[ChunkData]:
        """Contiguous chunks from the one holding `offset`, at least one, until `max_bytes` is
        reached; empty when offset is at or past the end. Raises OffsetOutOfRangeError below
        the log start, ReadRaceError when READ_ATTEMPTS snapshots in a row raced a swap.
        A read of the same offset under way, or kept (`s3stream.sharedreads`), answers it when
        it asked for at least `max_bytes`; then more chunks may come than asked for."""
        start = self.stream(stream_id).start_offset
        if offset < start:  # checked here too: kept reads
            raise OffsetOutOfRangeError(f"offset {offset} is below the log start {start}")
        return await self.shared_reads.read(
            (stream_id, offset), max_bytes,
            lambda: self._read_contiguous(stream_id, offset, max_bytes), _size,
            lambda out: self._stopped_short(stream_id, out),
            lambda out: out[-1].last_offset,
        )

    def _stopped_short(self, stream_id: int, out: list[ChunkData]) -> bool:
        """Whether a read stopped at its max_bytes with records after it (not at the end)."""
        st = self.streams.get(stream_id)  # gone if the partition moved away meanwhile
        return st is not None and bool(out) and out[-1].last_offset + 1 < st.end_offset

    async def _read_contiguous(
        self, stream_id: int, offset: int, max_bytes: int
    ) -> list[ChunkData]:
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
        end = span(chunks, first, max_bytes)  # from the one holding offset to max_bytes
        # what the stream's last read served has been sent (its reader asks again only once
        # it has the answer): evicted first if fetched from the store (`ChunkCache.served`).
        # Not sooner: the answer still holds those bytes, and while it is being sent the
        # cache shares them instead of holding other bytes beside them. Not the last chunk,
        # which the next read starts in when the answer ended inside it.
        for key in self._served.pop(stream_id, ()):
            self.cache.served(key)
        plan = self._begin(chunks, first, end, max_bytes)
        try:
            # planned before any GET starts, as the other reads of the same fetch: the GETs of
            # the read-aheads of a fetch's partitions join too (see `_join`)
            self._read_ahead(stream_id, chunks, end, max_bytes)
        finally:
            got = await self._finish(plan)
        self._served[stream_id] = [(c.object_id, c.position) for c in chunks[first:end - 1]]
        return [
            ChunkData(c.base_offset, c.last_offset, got[(c.object_id, c.position)])
            for c in chunks[first:end]
        ]

    def log_position(self, stream_id: int, offset: int, max_bytes: int) -> tuple[int, int] | None:
        """Where in the log a read of `max_bytes` from `offset` would go to the object store:
        the ids of the first and last WAL objects holding its chunks that are neither cached
        nor coming; None when there are none (answered from memory or stream objects, or
        nothing to read). WAL object ids grow with the time their records were written, and
        a WAL object holds a chunk of each stream written then: reads of several streams at
        the same place in the log share its GETs (`_join`)."""
        st = self.streams.get(stream_id)
        if st is None or not st.chunks or not st.start_offset <= offset < st.end_offset:
            return None
        chunks = st.chunks
        first = max(0, bisect.bisect_right(st.bases, offset) - 1)
        ids = [
            c.object_id for c in chunks[first:span(chunks, first, max_bytes)]
            if not self._cached_or_coming((c.object_id, c.position))
            and self._is_wal(c.object_id)
        ]
        return (min(ids), max(ids)) if ids else None

    def _cached_or_coming(self, key: tuple[int, int]) -> bool:
        """Whether the chunk is in the cache or a GET in flight will bring it."""
        return key in self._inflight or self.cache.contains(key)

    def _is_wal(self, object_id: int) -> bool:
        return self._object_keys.get(object_id, "").startswith(WAL_PREFIX)

    def _read_ahead(self, stream_id: int, chunks: list[Chunk], start: int, want: int) -> None:
        """Fetch, in the background, the chunks a reader that asked for `want` bytes will ask
        for next (chunks[start:] of a snapshot), so that its next read finds them in the cache
        while it is still busy with this one. One read-ahead per stream at a time; the bytes
        of all read-aheads in flight stay within a quarter of the cache, and what they fetch
        goes into the cache like any read.

        Read-aheads asked for in one turn of the event loop (the reads of one fetch are
        planned in one) are planned together at the start of the next, before any GET of
        theirs or of those reads starts: in stream order, so that the chunks of consecutive
        partitions stored back to back in a WAL object are one GET between them (`_join`),
        and with the budget shared evenly by the streams read lately (each gets
        min(want, budget / streams)): a fetch of many partitions reads ahead for every one of
        them, not the first few in full while the others fall behind in the log."""
        if start >= len(chunks) or stream_id in self._ahead:
            return
        self._readers(stream_id)
        if not self._ahead_asked:
            asyncio.get_running_loop().call_soon(self._plan_read_aheads)
        self._ahead_asked[stream_id] = (chunks, start, want)

    def _plan_read_aheads(self) -> None:
        asked, self._ahead_asked = self._ahead_asked, {}
        budget = self.cache.max_bytes // 4
        share = budget // max(self._readers(), 1)
        for stream_id in sorted(asked):
            chunks, start, want = asked[stream_id]
            if stream_id in self._ahead or stream_id not in self.streams:
                continue
            end = span(chunks, start, min(want, share))
            todo = [
                c for c in chunks[start:end]
                if not self._cached_or_coming((c.object_id, c.position))
            ]
            size = sum(c.length for c in todo)
            if not todo or self._ahead_bytes + size > budget:
                continue
            self._ahead_bytes += size
            plan = self._begin(chunks, start, end, want)  # in flight now: see _begin
            self._ahead[stream_id] = asyncio.ensure_future(self._run_ahead(stream_id, plan, size))

    async def _run_ahead(self, stream_id: int, plan: Fetch, size: int) -> None:
        try:
            await self._finish(plan)
        except Exception as e:  # a reader that needs these chunks reads them itself
            log.debug("read-ahead of stream %d failed: %r", stream_id, e)
        finally:
            self._ahead_bytes -= size
            self._ahead.pop(stream_id, None)

    def _readers(self, stream_id: int | None = None) -> int:
        """How many streams were read in the last READERS_WINDOW_S (`stream_id`: one now)."""
        now = time.monotonic()
        recent = self._recent_reads
        if stream_id is not None:
            recent[stream_id] = now
        if now - self._recent_pruned > READERS_WINDOW_S:
            self._recent_pruned = now
            for sid in [k for k, t in recent.items() if now - t > READERS_WINDOW_S]:
                del recent[sid]
        return len(recent)

    def cancel_read_ahead(self) -> None:
        self._ahead_asked.clear()
        for task in self._ahead.values():
            task.cancel()

    def _key(self, object_id: int) -> str:
        key = self._object_keys.get(object_id)
        if key is None:  # the GC deleted the object and forgot it: the chunk was replaced
            raise ObjectNotFoundError(f"object {object_id}")
        return key

    def _budget(self, want: int) -> int:
        """Bytes one range GET may cover for a read that asked for `want` bytes: the read-ahead
        setting, or what the read asked for if more, within a quarter of the cache."""
        return min(max(self.settings.readahead_bytes, want), self.cache.max_bytes // 4)

    @staticmethod
    def _extends(run: list[Chunk], c: Chunk, budget: int) -> bool:
        """Whether `c` is stored right after the run in the same object, within `budget`
        (so one range GET can cover both)."""
        head, last = run[0], run[-1]
        return (
            c.object_id == head.object_id
            and c.position == last.position + last.length
            and c.position + c.length - head.position <= budget
        )

    def _plan(
        self,
        chunks: list[Chunk],
        first: int,
        end: int,
        budget: int,
        got: dict[tuple[int, int], bytes],
    ) -> tuple[list[list[Chunk]], dict[tuple[int, int], InFlight]]:
        """Runs of chunks[first:end] to GET (chunks stored back to back in one object), after
        what the cache holds (into `got`) and what GETs in flight will bring (returned)."""
        runs: list[list[Chunk]] = []
        waits: dict[tuple[int, int], InFlight] = {}
        missed = -2  # index of the last chunk that was not in the cache
        for k in range(first, end):
            c = chunks[k]
            key = (c.object_id, c.position)
            data = self.cache.get(key)
            if data is not None:
                got[key] = bytes(data)  # a copy only if a bytearray
                continue
            flight = self._inflight.get(key)
            if flight is not None:
                waits[key] = flight
                continue
            if runs and missed == k - 1 and self._extends(runs[-1], c, budget):
                runs[-1].append(c)
            # a GET widened by others' chunks holds no more than a quarter of the cache
            elif (flight := self._join(c, max(budget, self.cache.max_bytes // 4))) is not None:
                waits[key] = flight
                continue
            else:
                runs.append([c])
            missed = k
        if runs and missed == end - 1:  # read ahead over what is stored after the last run
            for c in chunks[end:]:
                key = (c.object_id, c.position)
                if self._cached_or_coming(key) or not self._extends(runs[-1], c, budget):
                    break
                runs[-1].append(c)
        return runs, waits

    def _join(self, c: Chunk, budget: int) -> InFlight | None:
        """A GET of c's object planned by another read and not started yet that c is stored
        right before or after, widened to bring c too (within `budget`); None if there is
        none. The reads of a fetch of many partitions are planned one after the other before
        any of their GETs starts, and a WAL object holds a chunk of each partition back to
        back: they then make one GET per object between them, not one per partition and
        object (moto spends ~5 ms of CPU on any GET, plus reading the whole object for a
        range of it; S3 bills per request)."""
        for f in self._planned.get(c.object_id, ()):
            if c.position == f.hi and c.position + c.length - f.lo <= budget:
                f.hi = c.position + c.length
            elif c.position + c.length == f.lo and f.hi - c.position <= budget:
                f.lo = c.position
            else:
                continue
            key = (c.object_id, c.position)
            f.joined.append((c.position, c.length))
            f.keys.append(key)
            self._inflight[key] = f
            return f
        return None

    def _start(self, oid: int, flight: InFlight) -> None:
        """The flight's range is final from now on (it no longer takes joiners)."""
        if not flight.started:
            flight.started = True
            pending = self._planned.get(oid)
            if pending is not None:
                pending.remove(flight)
                if not pending:
                    del self._planned[oid]

    def _forget(self, flight: InFlight) -> None:
        """The flight has ended: its chunks are no longer coming (the cache has them)."""
        for k in flight.keys:
            if self._inflight.get(k) is flight:
                del self._inflight[k]

    def _begin(self, chunks: list[Chunk], first: int, end: int, want: int) -> Fetch:
        """The plan of a fetch of chunks[first:end] (of a snapshot), its GETs registered as in
        flight at once (synchronously, so a read planned right after this one waits for them);
        `_finish` must follow and returns their bytes by (object id, position): from the
        cache, from a GET already in flight (another read's, or a read-ahead's), else by
        range GETs, each covering a run of chunks stored back to back in one object, up to
        READ_CONCURRENCY of them at once (a catch-up read of WAL chunks needs one GET per
        chunk, which other streams' reads planned before it starts widen with their chunks
        stored next to them: `_join`). Each GET's body is read chunk by chunk
        (`objectstore.get_parts`): no copy of its whole range lives beside the chunks. The
        last run reads ahead over the chunks stored after it, within the GET
        budget (`_budget`: the read-ahead setting or the `want` bytes the read asked for,
        within a quarter of the cache). A GET in an object none of whose chunks is cached or
        coming covers them all, every stream's, while the objects one read fetches whole span
        at most that budget and a sixteenth of the cache in all: a catch-up of many
        partitions then makes one GET per WAL object, not one per partition and object. The
        sixteenth: the other streams' chunks must stay cached until their reads come, which a
        fetch spread over many partitions and objects needs room for; with less, they were
        evicted first and the same objects fetched again and again (1.9x the bytes in
        test_read_snapshot, read CPU 5.1 against 3.4 s/GiB with a 64 MiB cache). "In all":
        a read of 8 MiB of one of 100 partitions spans ~100 WAL objects; fetching each whole
        (each under a sixteenth) brought 100x its bytes, evicted before the other
        partitions' reads came (an object of 2 MiB downloaded 85 times in one catch-up).
        Everything fetched is cached, so the next read finds it."""
        got: dict[tuple[int, int], bytes] = {}
        budget = self._budget(want)
        runs, waits = self._plan(chunks, first, end, budget, got)
        whole = self.cache.max_bytes // WHOLE_OBJECT_SHARE  # bytes of objects GET whole, in all
        gets = []
        for run in runs:
            oid = run[0].object_id
            lo, hi = run[0].position, run[-1].position + run[-1].length
            others = set(self._object_chunks.get(oid, ()))  # a copy: it is used after the GET
            if others:
                olo, ohi = min(p for p, _ in others), max(p + n for p, n in others)
                if ohi - olo <= whole and olo <= lo and hi <= ohi and self._untouched(
                    oid, others
                ):
                    lo, hi = olo, ohi
                    whole -= ohi - olo
                else:
                    others = set()
            flight = InFlight(asyncio.get_running_loop().create_future(), lo, hi)
            mine = [(oid, p) for p, _ in others] + [(oid, c.position) for c in run]
            flight.keys = [k for k in mine if k not in self._inflight]
            for k in flight.keys:
                self._inflight[k] = flight
            self._planned.setdefault(oid, []).append(flight)
            gets.append(Get(run, others, flight))
        return Fetch(got, gets, list(waits.items()))

    def _untouched(self, oid: int, chunks: set[tuple[int, int]]) -> bool:
        """Whether none of these chunks of the object is cached or coming (then fetching it
        whole would download some of them twice)."""
        return not any(self._cached_or_coming((oid, p)) for p, _ in chunks)

    async def _finish(self, plan: Fetch) -> dict[tuple[int, int], bytes]:
        got = plan.got
        limit = asyncio.Semaphore(READ_CONCURRENCY)

        async def get(g: Get) -> None:
            oid, flight = g.run[0].object_id, g.flight
            try:
                async with limit:
                    self._start(oid, flight)
                    mine = [(c.position, c.length) for c in g.run]
                    cuts = pieces(flight.lo, flight.hi, [*g.others, *flight.joined, *mine])
                    data = await get_parts(
                        self.objects, self._key(oid), flight.lo, [n for _, n in cuts]
                    )
            except BaseException as e:
                _fail(flight, e)
                raise
            else:
                parts = {p: d for (p, _), d in zip(cuts, data, strict=True) if p >= 0}
                flight.parts.set_result(parts)
                for p, d in parts.items():
                    self.cache.put((oid, p), d, fetched=True)
                for c in g.run:
                    got[(oid, c.position)] = parts[c.position]
            finally:
                self._forget(flight)

        async def wait(key: tuple[int, int], flight: InFlight) -> None:
            got[key] = (await asyncio.shield(flight.parts)).get(key[1], b"")

        work = [get(g) for g in plan.gets] + [wait(*w) for w in plan.waits]
        try:
            results = await asyncio.gather(*work, return_exceptions=True)
        finally:
            # every GET has ended, one way or another; one cancelled before its task ran
            # never got to its own clean-up, and a read waiting on it would wait forever
            for g in plan.gets:
                self._start(g.run[0].object_id, g.flight)
                if not g.flight.parts.done():
                    _fail(g.flight, asyncio.CancelledError())
                self._forget(g.flight)
        for r in results:
            if isinstance(r, BaseException):
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
