"""Records as columns: what a table topic's writer reads from the log, decoded batch by batch
into flat lists (offsets, timestamps, keys, values, headers) instead of one `Record` object per
record, for the converters that work column-wise (tabletopic.convert.Converter). A `Record` is
built only where one is needed (a dead letter, a converter that takes records).

`decode_columns` gives what `broker.protocol.recordcodec.decode_records` gives, field for field
and error for error (CorruptBatchError; tests/unit/test_columnar.py compares the two). The
records of a batch are parsed by aiokafka's compiled parser (`aiokafka.record.default_records.
DefaultRecordBatch`, Cython: ~6x faster than Python here), on the body as floe's bounded
`decompress` gives it, with the batch header rewritten to say uncompressed. A batch it refuses
(a record whose fields do not add up to its length, bytes left over, a header key not UTF-8,
...) is decoded again by decode_records itself (records, or its CorruptBatchError). aiokafka
reads a record's attributes as a varint, Kafka and decode_records as one byte, and keeps the
low 64 bits of a 10-byte varint where decode_records keeps them all: they differ only for a
record whose attributes byte has its top bit set (attributes are unused in v2: clients write 0)
or with a field beyond 64 bits, which no client writes either (a corrupt batch with a right
CRC). Its reads past the end of a malformed record (a header's varints, up to 10 bytes, are
read before its bounds check) land in padding of ours, never outside the buffer.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from broker.protocol.recordcodec import Record, decode_records
from broker.protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    CorruptBatchError,
    decompress,
    iter_headers,
)

try:
    from aiokafka.record.default_records import DefaultRecordBatch as _CBatch
except ImportError:  # pragma: no cover - a dependency; the Python parser does without
    _CBatch = None

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(slots=True)
class Columns:
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)  # ms since the epoch
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[Headers] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def record(self, i: int) -> Record:
        return Record(self.offsets[i], self.timestamps[i], self.keys[i], self.values[i],
                      self.headers[i])

    def records(self) -> list[Record]:
        return [Record(*r) for r in zip(self.offsets, self.timestamps, self.keys, self.values,
                                        self.headers, strict=True)]

    def take(self, rows: list[int]) -> Columns:
        """The given rows, in that order."""
        return Columns([self.offsets[i] for i in rows], [self.timestamps[i] for i in rows],
                       [self.keys[i] for i in rows], [self.values[i] for i in rows],
                       [self.headers[i] for i in rows])

    def before(self, offset: int) -> Columns:
        """The rows below `offset` (offsets ascend)."""
        n = sum(1 for o in self.offsets if o < offset)
        return Columns(self.offsets[:n], self.timestamps[:n], self.keys[:n], self.values[:n],
                       self.headers[:n])

    @classmethod
    def of(cls, records: Iterable[Record]) -> Columns:
        out = cls()
        for r in records:
            out.offsets.append(r.offset)
            out.timestamps.append(r.timestamp)
            out.keys.append(r.key)
            out.values.append(r.value)
            out.headers.append(r.headers)
        return out


_PAD = bytes(16)  # more than the longest varint aiokafka may read past a record's end
_LENGTH_AT, _ATTRIBUTES_AT = 8, 21  # batch length (int32) and attributes (int16) in a header


def decode_columns(data: bytes, batches: list[BatchHeader], offset: int,
                   compiled: bool = True) -> Columns:
    """The records at or after `offset` of the given (non-control) batches of `data`
    (`compiled`: with aiokafka's parser where it takes the batch; False: Python only)."""
    out = Columns()
    for h in batches:
        if h.is_control:
            continue
        if compiled and _CBatch is not None:
            n = len(out)
            try:
                _decode_compiled(out, data, h, offset)
                continue
            except CorruptBatchError:
                raise
            except Exception:  # refused: the Python parser says what it is
                for column in (out.offsets, out.timestamps, out.keys, out.values, out.headers):
                    del column[n:]
        _decode_batch(out, data, h, offset)
    return out


def _decode_compiled(out: Columns, data: bytes, h: BatchHeader, offset: int) -> None:
    view = memoryview(data)
    body = decompress(h.compression, _records_section(view, h.position, h))
    head = bytearray(view[h.position : h.position + HEADER_SIZE])
    struct.pack_into(">i", head, _LENGTH_AT, HEADER_SIZE - 12 + len(body))
    struct.pack_into(">h", head, _ATTRIBUTES_AT, h.attributes & ~0x07)
    buf = bytes(head) + body + _PAD
    records: Any = _CBatch(memoryview(buf)[: len(buf) - len(_PAD)])
    offsets, timestamps = out.offsets, out.timestamps
    keys, values, headers = out.keys, out.values, out.headers
    low = h.base_offset < offset
    for r in records:
        if low and r.offset < offset:
            continue
        offsets.append(r.offset)
        timestamps.append(r.timestamp)
        keys.append(r.key)
        values.append(r.value)
        hs = r.headers
        headers.append(tuple(hs) if hs else ())


def _records_section(view: memoryview, at: int, h: BatchHeader) -> memoryview:
    """The records of batch `h`, which starts `at` bytes into `view`, as stored (compressed or
    not), after its header."""
    return view[at + HEADER_SIZE : at + h.size]


Body = tuple[bytes | memoryview, int, int, int, bool, int]


class Parts:
    """A read's whole batches as the buffers that hold them (a RecordSet's parts, each a run
    of whole batches), addressed as if they were joined: a header's position counts from the
    start of the first part. The C path (`batch_bodies`) slices each batch's records out of
    its own part, so a read of megabytes is not first copied into one new buffer (4 MiB: ~3.6
    ms of page faults and copying, on the event loop, per read of a catch-up); what needs one
    buffer joins them (`tobytes`, once)."""

    __slots__ = ("_joined", "parts", "starts")

    def __init__(self, parts: Sequence[bytes | memoryview]) -> None:
        self.parts = tuple(memoryview(p) for p in parts)
        starts, pos = [], 0
        for p in self.parts:
            starts.append(pos)
            pos += len(p)
        self.starts = tuple(starts)
        self._joined: bytes | None = None

    @classmethod
    def of(cls, data: bytes | Parts) -> Parts:
        """`data` as parts (joined bytes: one part, positions unchanged)."""
        return data if isinstance(data, Parts) else cls((data,))

    def __len__(self) -> int:
        return self.starts[-1] + len(self.parts[-1]) if self.parts else 0

    def headers(self) -> list[BatchHeader]:
        """Every batch's header, positions as if joined (CorruptBatchError: a part that is
        not whole batches)."""
        out: list[BatchHeader] = []
        for part, start in zip(self.parts, self.starts, strict=True):
            out += iter_headers(part, start)
        return out

    def _find(self, h: BatchHeader) -> tuple[memoryview, int]:
        """The part holding the batch `h` (a header of `headers()`), and where in it."""
        i = bisect.bisect_right(self.starts, h.position) - 1
        local = h.position - self.starts[i] if i >= 0 else -1
        if local < 0 or local + h.size > len(self.parts[i]):
            raise CorruptBatchError(f"no part holds the batch at {h.position}")
        return self.parts[i], local

    def batch(self, h: BatchHeader) -> tuple[memoryview, BatchHeader]:
        """The part holding the batch `h` (a header of `headers()`) and `h` positioned in it."""
        part, local = self._find(h)
        return part, replace(h, position=local) if local != h.position else h

    def records_section(self, h: BatchHeader) -> memoryview:
        """The batch's records, as stored (compressed or not), after its header."""
        return _records_section(*self._find(h), h)

    def tobytes(self) -> bytes:
        if self._joined is None:
            self._joined = b"".join(self.parts)
        return self._joined


def joined(data: bytes | Parts) -> bytes:
    """`data` as one buffer."""
    return data.tobytes() if isinstance(data, Parts) else data


def batch_bodies(data: bytes | Parts, batches: list[BatchHeader]) -> list[Body]:
    """The records section of each non-control batch of `data`, uncompressed (by floe's
    bounded `decompress`: CorruptBatchError if it is not valid), with what its records need
    of the header: (body, base offset, base timestamp, max timestamp, log-append time,
    record count), as tabletopic._batchjson.decode takes them."""
    parts = Parts.of(data)
    out: list[Body] = []
    for h in batches:
        if h.is_control:
            continue
        raw = parts.records_section(h)
        body = raw if h.compression == 0 else decompress(h.compression, raw)
        out.append((body, h.base_offset, h.base_timestamp, h.max_timestamp, h.log_append_time,
                    h.record_count))
    return out


def _decode_batch(out: Columns, data: bytes, h: BatchHeader, offset: int) -> None:
    """floe's own parser (broker.protocol.recordcodec): a batch aiokafka's refuses gets its
    records, or its CorruptBatchError, from there."""
    for r in decode_records(data, h):
        if r.offset >= offset:
            out.offsets.append(r.offset)
            out.timestamps.append(r.timestamp)
            out.keys.append(r.key)
            out.values.append(r.value)
            out.headers.append(r.headers)
