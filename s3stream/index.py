"""The in-memory chunk index: each stream's chunk list and each object's live extents.

Contract:
- A `Stream`'s chunk list is copy-on-write: compaction and retention assign a new list, never
  edit one in place; commits only append at the end. So a reader may hold `st.chunks` across an
  await as a consistent snapshot (see `s3stream.reader`).
- `end_offset` is durable (every offset below it is committed); `next_offset` is what appends
  have been handed (`s3stream.wal` moves one, then the other, and rewinds `next_offset` to
  `end_offset` when a flush fails for good).
- `IndexMixin` keeps, per object, the (position, length) of its live chunks, every stream's, so
  a read of one chunk in a small WAL object can fetch the whole object (`s3stream.reader`).
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from s3stream.metadata import ChunkRow

# A stream's commit times: one entry per COMMIT_TICK_S at most, the last COMMIT_TIMES kept (7
# minutes of a stream committed without pause, ~0.5 MiB). One entry per WAL commit (~200 a
# second under load) kept up to 65,536 of them: ~7.6 MiB per partition written without
# pause, 100 partitions 760 MiB (benchmarks/README.md, tablebacklog).
COMMIT_TICK_S = 0.1
COMMIT_TIMES = 4096


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
    # (end offset after the commits of one COMMIT_TICK_S, wall-clock time of the first of
    # them), for freshness figures (`commit_time`)
    commits: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=COMMIT_TIMES))

    def committed(self, end_offset: int, now: float) -> None:
        """Record that the stream is durable up to `end_offset` at wall-clock time `now`: in
        the last entry when it began less than COMMIT_TICK_S before."""
        if self.commits and now - self.commits[-1][1] < COMMIT_TICK_S:
            self.commits[-1] = (end_offset, self.commits[-1][1])
        else:
            self.commits.append((end_offset, now))

    def commit_time(self, offset: int) -> float | None:
        """When `offset` became durable, at most COMMIT_TICK_S early (None if after the last
        commit or before this process; the oldest time kept if older than the window)."""
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


def by_stream(new: list[ChunkRow], old: list[ChunkRow]
              ) -> dict[int, tuple[list[ChunkRow], list[ChunkRow]]]:
    """The new and the old chunks of a swap (`IndexMixin.replace_chunks`), by stream."""
    out: dict[int, tuple[list[ChunkRow], list[ChunkRow]]] = {}
    for c in new:
        out.setdefault(c.stream_id, ([], []))[0].append(c)
    for c in old:
        out.setdefault(c.stream_id, ([], []))[1].append(c)
    return out


def _replaced(st: Stream, old: list[ChunkRow], new: list[Chunk]) -> list[Chunk]:
    """The stream's chunk list with `old` (its chunks in compacted objects) swapped for `new`
    (the same offsets in new objects). A compaction's old chunks of a stream are one run of
    its list (the oldest WAL objects' chunks, in offset order): spliced in place, each checked
    (a pass over them, no set of every chunk of the stream: ~60k chunks a run took 0.28 s of
    the event loop that way); anything else the long way."""
    old = sorted(old, key=lambda c: c.base_offset)
    new = sorted(new, key=lambda c: c.base_offset)
    chunks = st.chunks
    i = bisect.bisect_left(st.bases, old[0].base_offset) if old else 0
    j = i + len(old)
    if old and j <= len(chunks) and all(
        c.base_offset == o.base_offset and c.object_id == o.object_id
        for c, o in zip(chunks[i:j], old, strict=True)
    ) and (i == 0 or not new or chunks[i - 1].base_offset < new[0].base_offset) and (
        j == len(chunks) or not new or new[-1].base_offset < chunks[j].base_offset
    ):
        return chunks[:i] + new + chunks[j:]
    gone = {(o.base_offset, o.object_id) for o in old}
    kept = [c for c in chunks if (c.base_offset, c.object_id) not in gone] + new
    kept.sort(key=lambda c: c.base_offset)
    return kept


def wake_readers(st: Stream) -> None:
    """Resolve the futures of `wait_for_append` calls waiting on the stream."""
    waiters, st.waiters = st.waiters, []
    for w in waiters:
        if not w.done():
            w.set_result(None)


class IndexMixin:
    """The chunk index part of `s3stream.log.LogStore` (which sets these attributes)."""

    streams: dict[int, Stream]
    _object_keys: dict[int, str]
    # (position, length) of the live chunks of each object, every stream's
    _object_chunks: dict[int, set[tuple[int, int]]]

    def stream(self, stream_id: int) -> Stream:
        try:
            return self.streams[stream_id]
        except KeyError:
            raise UnknownStreamError(stream_id) from None

    def _load_chunks(self, chunks: Iterable[ChunkRow]) -> None:
        """Index the chunks read from the metadata store at open (of known streams only)."""
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

    def replace_chunks(
        self, new: list[ChunkRow], old: list[ChunkRow], keys: dict[int, str]
    ) -> None:
        """Apply a committed compaction to the in-memory index."""
        self._object_keys.update(keys)
        for c in old:
            self._object_chunks.get(c.object_id, set()).discard((c.position, c.length))
        for c in new:
            self._object_chunks.setdefault(c.object_id, set()).add((c.position, c.length))
        for sid, (new_of, old_of) in by_stream(new, old).items():
            st = self.streams.get(sid)
            if st is not None:
                st.set_chunks(_replaced(st, old_of, [
                    Chunk(c.base_offset, c.last_offset, c.object_id, c.position, c.length,
                          c.max_timestamp) for c in new_of]))

    def forget_objects(self, object_ids: list[int]) -> None:
        for oid in object_ids:
            self._object_keys.pop(oid, None)
            self._object_chunks.pop(oid, None)

    def _drop_chunks_below(self, st: Stream, start_offset: int) -> None:
        """Drop the stream's chunks wholly below `start_offset` (retention)."""
        for c in st.chunks:
            if c.last_offset < start_offset:
                self._object_chunks.get(c.object_id, set()).discard((c.position, c.length))
        st.set_chunks([c for c in st.chunks if c.last_offset >= start_offset])
