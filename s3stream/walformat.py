"""The WAL object format: the record batches of many streams written by one flush.

    offset  size  field
    0       4     magic b"FLWO"
    4       1     format version (1)
    5       3     reserved, zero
    8       8     object id (uint64)
    16      4     chunk count N (uint32)
    20      4     CRC-32C of bytes 0..19 and of the index (uint32)
    24      ...   data: the chunks, back to back; a chunk is the contiguous record batches of
                  one stream, offsets already assigned
    end-40N 40N   index, one entry per chunk:
                    stream id u64, base offset i64, last offset i64, position u64 (from the
                    start of the object), length u32, CRC-32C of the chunk's bytes u32
    -- the index starts at `size - 40 * N`; a reader needs only the 24-byte header and the tail.

The metadata store records the same chunks, so a reader normally never parses the index;
it exists so an object is self-describing (recovery tools, compaction, audits).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

MAGIC = b"FLWO"
VERSION = 1
_HEADER = struct.Struct(">4sB3xQII")
_ENTRY = struct.Struct(">QqqQII")
HEADER_SIZE = _HEADER.size


class WalFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    stream_id: int
    base_offset: int
    last_offset: int
    position: int
    length: int
    crc: int


def encode(
    object_id: int, chunks: Sequence[tuple[int, int, int, bytes | bytearray]]
) -> tuple[bytes, list[ChunkEntry]]:
    """chunks: (stream id, base offset, last offset, bytes). Returns the object and its index."""
    parts, _size, entries = encode_parts(object_id, chunks)
    return b"".join(parts), entries


Part = bytes | bytearray | memoryview


def encode_parts(
    object_id: int, chunks: Sequence[tuple[int, int, int, Part]]
) -> tuple[list[Part], int, list[ChunkEntry]]:
    """Like `encode`, the object as parts to write one after the other (the chunks' bytes
    themselves, not copied), and its size."""
    entries = []
    parts: list[Part] = [b""]
    pos = HEADER_SIZE
    for stream_id, base, last, data in chunks:
        entries.append(ChunkEntry(stream_id, base, last, pos, len(data), crc32c(data)))
        parts.append(data)
        pos += len(data)
    index = b"".join(
        _ENTRY.pack(e.stream_id, e.base_offset, e.last_offset, e.position, e.length, e.crc)
        for e in entries
    )
    head_wo_crc = _HEADER.pack(MAGIC, VERSION, object_id, len(entries), 0)[:20]
    crc = crc32c(index, crc32c(head_wo_crc))
    parts[0] = _HEADER.pack(MAGIC, VERSION, object_id, len(entries), crc)
    parts.append(index)
    return parts, pos + len(index), entries


def decode_index(data: bytes) -> tuple[int, list[ChunkEntry]]:
    """(object id, entries) of a whole WAL object; checks magic, version and CRCs."""
    if len(data) < HEADER_SIZE:
        raise WalFormatError("object shorter than a WAL header")
    magic, version, object_id, count, crc = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise WalFormatError(f"bad magic {magic!r}")
    if version != VERSION:
        raise WalFormatError(f"unsupported WAL format version {version}")
    index_pos = len(data) - _ENTRY.size * count
    if index_pos < HEADER_SIZE:
        raise WalFormatError("index does not fit the object")
    index = data[index_pos:]
    if crc32c(index, crc32c(data[:20])) != crc:
        raise WalFormatError("header/index CRC mismatch")
    entries = [ChunkEntry(*_ENTRY.unpack_from(index, i * _ENTRY.size)) for i in range(count)]
    for e in entries:
        if crc32c(data[e.position : e.position + e.length]) != e.crc:
            raise WalFormatError(f"chunk of stream {e.stream_id} at {e.position}: CRC mismatch")
    return object_id, entries
