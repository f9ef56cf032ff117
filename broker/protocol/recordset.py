"""Record batches served by a fetch, as views of the buffers that hold them.

A fetch answers up to `fetch.max.bytes` (librdkafka: 50 MiB; the benchmarks' consumer 64
MiB) of batches gathered from many chunks. Joining them into one `bytes` per partition, and
cutting that again for a byte limit or the last stable offset, copied every byte served once
or twice and made each fetch allocate and free buffers of megabytes (which glibc then keeps:
the broker's peak RSS, issue 17). A `RecordSet` keeps the batches as read-only views of the
chunks (one view per run of adjacent batches in a chunk) with each batch's end and last
offset, so cutting it copies nothing, and the response encoder (broker/protocol/writer.py)
writes the views as they are, after the records field's length.
tests/unit/test_recordset.py pins that: a Fetch response of every served version encodes to
the same bytes with a RecordSet as with the joined bytes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from broker.protocol.records import BatchHeader


@dataclass(frozen=True, slots=True)
class RecordSet:
    parts: tuple[memoryview, ...]  # read-only views, in order; together: the batches
    ends: tuple[int, ...]  # each batch's end, in bytes from the start of the set
    last_offsets: tuple[int, ...]  # each batch's last offset

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __bool__(self) -> bool:
        return bool(self.ends)

    @property
    def batches(self) -> int:
        return len(self.ends)

    def tobytes(self) -> bytes:
        return b"".join(self.parts)

    def first(self, n: int) -> RecordSet:
        """The first n batches."""
        if n >= len(self.ends):
            return self
        if n <= 0:
            return EMPTY
        size = self.ends[n - 1]
        parts: list[memoryview] = []
        have = 0
        for p in self.parts:
            if have + len(p) >= size:
                parts.append(p[: size - have])
                break
            parts.append(p)
            have += len(p)
        return RecordSet(tuple(parts), self.ends[:n], self.last_offsets[:n])

    def within(self, limit: int, must_return_one: bool) -> RecordSet:
        """The whole batches that fit in `limit` bytes (at least one if must_return_one)."""
        n = bisect.bisect_right(self.ends, limit)
        return self.first(max(n, 1) if must_return_one else n)

    def below(self, offset: int) -> RecordSet:
        """The batches before the first one that reaches `offset` (e.g. the last stable
        offset: a batch ending at or above it is left out)."""
        return self.first(bisect.bisect_left(self.last_offsets, offset))


EMPTY = RecordSet((), (), ())


class RecordSetBuilder:
    """Adds batches (views of chunks) in order; adjacent batches of one chunk become one
    view."""

    def __init__(self) -> None:
        self._parts: list[memoryview] = []
        self._ends: list[int] = []
        self._last_offsets: list[int] = []
        self._size = 0
        self._run: tuple[bytes, int, int] | None = None  # chunk, start, end of the open view

    def __len__(self) -> int:
        return self._size

    def add(self, chunk: bytes, h: BatchHeader) -> None:
        """The batch `h` read from `chunk` (h.position is its place in the chunk)."""
        start, end = h.position, h.position + h.size
        run = self._run
        if run is not None and run[0] is chunk and run[2] == start:
            self._run = (chunk, run[1], end)
        else:
            self._close()
            self._run = (chunk, start, end)
        self._size += h.size
        self._ends.append(self._size)
        self._last_offsets.append(h.last_offset)

    def _close(self) -> None:
        if self._run is not None:
            chunk, start, end = self._run
            self._parts.append(memoryview(chunk)[start:end].toreadonly())
            self._run = None

    def build(self) -> RecordSet:
        self._close()
        if not self._ends:
            return EMPTY
        return RecordSet(tuple(self._parts), tuple(self._ends), tuple(self._last_offsets))

