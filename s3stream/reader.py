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
from typing import NamedTuple

from s3stream.cache import ChunkCache
from s3stream.index import Chunk, IndexMixin
from s3stream.objectstore import ObjectNotFoundError, ObjectStore
from s3stream.wal import WalSettings

log = logging.getLogger("s3stream.log")  # the name operators' log filters know

READ_ATTEMPTS = 5  # a read that keeps racing chunk swaps gives up (retriable) after this many
READ_CONCURRENCY = 8  # range GETs one read has in flight at once


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


class ReaderMixin(IndexMixin):
    """The read path of `s3stream.log.LogStore` (which sets these attributes)."""

    objects: ObjectStore
    settings: WalSettings
    cache: ChunkCache

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
