"""Kafka record batches (magic v2) as the broker sees them: headers only, never record bodies.

Batch layout (big endian), offsets from the start of the batch:

    0  base_offset        int64   rewritten by the broker on append (not under the CRC)
    8  batch_length       int32   bytes after this field
   12  leader_epoch       int32   rewritten by the broker (not under the CRC)
   16  magic              int8    must be 2
   17  crc                uint32  CRC-32C of bytes 21..end
   21  attributes         int16   bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control
   23  last_offset_delta  int32
   27  base_timestamp     int64
   35  max_timestamp      int64
   43  producer_id        int64
   51  producer_epoch     int16
   53  base_sequence      int32
   57  record_count       int32
   61  records...
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any, TypeAlias

from crc32c import crc32c

Buffer: TypeAlias = bytes | bytearray | memoryview  # a record set, as received or stored

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
_HEAD = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")


class CorruptBatchError(ValueError):
    """The bytes are not a well-formed v2 record batch (Kafka: CORRUPT_MESSAGE)."""


class UnsupportedMagicError(CorruptBatchError):
    """A batch with magic 0 or 1 (Kafka: UNSUPPORTED_FOR_MESSAGE_FORMAT)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    position: int  # where the batch starts in the buffer it was read from
    base_offset: int
    batch_length: int
    leader_epoch: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0, base: int = 0) -> BatchHeader:
    """Decode the header of the batch at `pos`; checks framing but not the CRC. Its position
    is `base + pos` (`buf` a part of a larger whole that starts `base` bytes in)."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatchError(f"truncated batch header at {pos}")
    fields = _HEAD.unpack_from(buf, pos)
    magic = fields[3]
    if magic != 2:
        raise UnsupportedMagicError(f"record batch magic {magic} is not supported (only v2)")
    batch_length = fields[1]
    if batch_length < _MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + batch_length > len(buf):
        raise CorruptBatchError(f"batch length {batch_length} at {pos} does not fit the buffer")
    return BatchHeader(base + pos, fields[0], batch_length, fields[2], *fields[4:])


def iter_headers(buf: bytes | bytearray | memoryview, base: int = 0) -> list[BatchHeader]:
    """All batch headers of a buffer made of whole batches (as stored; no CRC check); their
    positions count from `base` (see `read_header`)."""
    out = []
    pos = 0
    end = len(buf)
    while pos < end:
        h = read_header(buf, pos, base)
        out.append(h)
        pos += h.size
    return out


def validate(buf: bytes | bytearray | memoryview) -> list[BatchHeader]:
    """Check a produced records blob: whole v2 batches, CRC-32C right, counts consistent."""
    if len(buf) == 0:
        raise CorruptBatchError("empty record set")
    headers = iter_headers(buf)
    view = memoryview(buf)
    for h in headers:
        if crc32c(view[h.position + 21 : h.position + h.size]) != h.crc:
            raise CorruptBatchError(f"CRC mismatch in batch at byte {h.position}")
        if h.record_count <= 0 or h.last_offset_delta != h.record_count - 1:
            raise CorruptBatchError(
                f"batch at byte {h.position}: {h.record_count} records but last offset delta"
                f" {h.last_offset_delta}"
            )
        if h.record_count > max_records(h):
            raise CorruptBatchError(
                f"batch at byte {h.position}: {h.record_count} records cannot fit in it"
            )
    return headers


MIN_RECORD_SIZE = 7  # length, attributes, timestamp and offset deltas, key, value, headers


def max_records(h: BatchHeader) -> int:
    """The most records a batch can hold: each takes MIN_RECORD_SIZE bytes at least, of its
    body (uncompressed) or of what its body may inflate to (compressed)."""
    body = MAX_DECOMPRESSED_BYTES if h.compression else h.size - HEADER_SIZE
    return body // MIN_RECORD_SIZE


def assign_offsets(
    buf: bytearray | memoryview,
    headers: list[BatchHeader],
    base_offset: int,
    log_append_time_ms: int | None,
) -> int:
    """Rewrite base offsets (and, for LogAppendTime topics, the timestamp type, max timestamp
    and CRC) in place; return the next offset after the last batch."""
    offset = base_offset
    for h in headers:
        _I64.pack_into(buf, h.position, offset)
        if log_append_time_ms is not None:
            attrs = h.attributes | TIMESTAMP_TYPE_BIT
            struct.pack_into(">h", buf, h.position + 21, attrs)
            _I64.pack_into(buf, h.position + 35, log_append_time_ms)
            crc = crc32c(memoryview(buf)[h.position + 21 : h.position + h.size])
            _U32.pack_into(buf, h.position + 17, crc)
        offset += h.last_offset_delta + 1
    return offset


# ------------------------------------------------------------------------------------------
# Record-level reading (only what offset-by-timestamp lookups need)
# ------------------------------------------------------------------------------------------
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


MAX_DECOMPRESSED_BYTES = 256 << 20
"""Compressed records that inflate beyond this are corrupt. A few kilobytes of zstd or gzip
can claim gigabytes; decompressing them whole would take that much memory (and cramjam's Rust
code aborts the process when an allocation fails). 256 MiB is far above what a batch within
max.message.bytes holds in practice, and far below what would threaten the broker."""


def decompress(codec: int, data: bytes | memoryview,
               max_size: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The records section of a batch, uncompressed; CorruptBatchError if it is not valid
    `codec` data or would inflate beyond `max_size` bytes (never allocates more)."""
    import cramjam

    if codec == 0:
        return bytes(data)
    if codec == 2:
        raw = bytes(data)
        if raw.startswith(_XERIAL_MAGIC):  # the Java client's snappy-java framing
            out = bytearray()
            pos = 16
            while pos < len(raw):
                if pos + 4 > len(raw):
                    raise CorruptBatchError("truncated snappy-java chunk header")
                (n,) = struct.unpack_from(">i", raw, pos)
                if n < 0 or pos + 4 + n > len(raw):
                    raise CorruptBatchError(f"snappy-java chunk of {n} bytes at {pos}")
                out += _bounded(cramjam.snappy.decompress_raw_into, raw[pos + 4 : pos + 4 + n],
                                max_size - len(out))
                pos += 4 + n
            return bytes(out)
        return _bounded(cramjam.snappy.decompress_raw_into, raw, max_size)
    into = {1: cramjam.gzip.decompress_into, 3: cramjam.lz4.decompress_into,
            4: cramjam.zstd.decompress_into}.get(codec)
    if into is None:
        raise CorruptBatchError(f"unknown compression codec {codec}")
    return _bounded(into, data, max_size)


def _bounded(into: Any, data: bytes | memoryview, max_size: int) -> bytes:
    """Decompress into a buffer that grows 4x per try (from 4x the input), up to max_size.

    The buffer is an anonymous mapping: pages cost memory only once written, so a corrupt
    input (which fails on every try) or a small output never touches the untouched rest."""
    size = min(max_size, max(1 << 16, 4 * len(data)))
    while True:
        buf = mmap.mmap(-1, max(size, 1))
        try:
            n = into(data, buf)
            return buf[:n]
        except Exception as e:  # cramjam.DecompressionError: corrupt, or the buffer too small
            if size >= max_size:
                raise CorruptBatchError(
                    f"compressed records are corrupt or inflate beyond {max_size} bytes: {e}"
                ) from e
            size = min(size * 4, max_size)
        finally:
            buf.close()


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise CorruptBatchError("truncated varint")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptBatchError("varint too long")
    return (raw >> 1) ^ -(raw & 1), pos


def record_timestamps(
    batch: bytes | bytearray | memoryview, h: BatchHeader
) -> list[tuple[int, int]]:
    """(offset, timestamp) of every record of one batch (decompressing if needed); only the
    records that are there, whatever count the header claims (CorruptBatchError if short)."""
    body = decompress(
        h.compression, memoryview(batch)[h.position + HEADER_SIZE : h.position + h.size]
    )
    out = []
    pos = 0
    for _ in range(h.record_count):
        length, pos = _varint(body, pos)
        end = pos + length
        pos += 1  # attributes
        ts_delta, pos = _varint(body, pos)
        off_delta, pos = _varint(body, pos)
        ts = h.max_timestamp if h.log_append_time else h.base_timestamp + ts_delta
        out.append((h.base_offset + off_delta, ts))
        pos = end
    return out
