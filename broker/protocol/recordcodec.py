"""Whole records of v2 batches: decoding (for table topics) and encoding (for the broker's own
writes, such as dead-letter records). The broker's produce/fetch path never needs this."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from crc32c import crc32c

from broker.protocol.records import HEADER_SIZE, BatchHeader, CorruptBatchError, decompress


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int  # ms since the epoch
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The zigzag varint at pos and the position after it (CorruptBatchError if over 64 bits;
    IndexError past the end)."""
    b = buf[pos]
    if b < 0x80:  # one-byte fast path (most lengths and deltas of small records)
        return (b >> 1) ^ -(b & 1), pos + 1
    raw, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptBatchError("varint too long")


def decode_records(batch: bytes | bytearray | memoryview, h: BatchHeader) -> list[Record]:
    """Every record of one batch (control batches yield nothing)."""
    if h.is_control:
        return []
    body = decompress(
        h.compression, memoryview(batch)[h.position + HEADER_SIZE : h.position + h.size]
    )
    log_append = h.log_append_time
    out: list[Record] = []
    pos = 0
    try:
        for _ in range(h.record_count):
            length, pos = read_varint(body, pos)
            end = pos + length
            pos += 1  # attributes (unused in v2)
            ts_delta, pos = read_varint(body, pos)
            off_delta, pos = read_varint(body, pos)
            klen, pos = read_varint(body, pos)
            key = None if klen < 0 else body[pos : pos + klen]
            pos += max(klen, 0)
            vlen, pos = read_varint(body, pos)
            value = None if vlen < 0 else body[pos : pos + vlen]
            pos += max(vlen, 0)
            count, pos = read_varint(body, pos)
            headers = []
            for _h in range(count):
                hklen, pos = read_varint(body, pos)
                if hklen < 0:  # would move pos back: a loop of `count` (up to 2**63) rounds
                    raise CorruptBatchError("negative header key length")
                hkey = body[pos : pos + hklen].decode("utf-8", "replace")
                pos += hklen
                hvlen, pos = read_varint(body, pos)
                hval = None if hvlen < 0 else body[pos : pos + hvlen]
                pos += max(hvlen, 0)
                headers.append((hkey, hval))
            if pos != end:
                raise CorruptBatchError("record length does not match its fields")
            out.append(
                Record(
                    h.base_offset + off_delta,
                    h.max_timestamp if log_append else h.base_timestamp + ts_delta,
                    key,
                    value,
                    tuple(headers),
                )
            )
    except IndexError:
        raise CorruptBatchError("record runs past the end of its batch") from None
    return out


def _zigzag(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field(b: bytes | None) -> bytes:
    return _zigzag(-1) if b is None else _zigzag(len(b)) + b


def encode_batch(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    timestamp_ms: int | None = None,
) -> bytes:
    """One uncompressed v2 batch (offsets from 0, no producer id) with a correct CRC."""
    if not records:
        raise ValueError("a batch needs at least one record")
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    body = bytearray()
    for i, (key, value, headers) in enumerate(records):
        rec = bytearray(b"\x00")  # attributes
        rec += _zigzag(0) + _zigzag(i) + _field(key) + _field(value) + _zigzag(len(headers))
        for hk, hv in headers:
            rec += _field(hk.encode()) + _field(hv)
        body += _zigzag(len(rec)) + rec
    after_crc = struct.pack(">hiqqqhii", 0, len(records) - 1, ts, ts, -1, -1, -1, len(records))
    after_crc += body
    head = struct.pack(">qiib", 0, len(after_crc) + 9, 0, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


# ------------------------------------------------------------------------------------------
# Rewriting whole batches (log compaction, topic compression.type): records are kept as they
# were sent except for what the rewrite means to change.
# ------------------------------------------------------------------------------------------
DELETE_HORIZON_BIT = 0x40  # KIP-534: base_timestamp holds the tombstones' delete horizon
CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record of a batch, decoded only as far as a rewrite needs: its offset delta and
    absolute timestamp, key and value, and its headers as the exact bytes that were sent."""

    offset_delta: int
    timestamp: int  # base_timestamp + delta as stored (the producer's CreateTime)
    key: bytes | None
    value: bytes | None
    headers: bytes  # header count varint and the headers, verbatim


def decode_raw(batch: bytes | bytearray | memoryview, h: BatchHeader) -> list[RawRecord]:
    """Every record of one (non-control) batch, for rewriting it."""
    body = decompress(
        h.compression, memoryview(batch)[h.position + HEADER_SIZE : h.position + h.size]
    )
    out: list[RawRecord] = []
    pos = 0
    try:
        for _ in range(h.record_count):
            length, pos = read_varint(body, pos)
            end = pos + length
            pos += 1  # attributes (unused in v2)
            ts_delta, pos = read_varint(body, pos)
            off_delta, pos = read_varint(body, pos)
            klen, pos = read_varint(body, pos)
            key = None if klen < 0 else body[pos : pos + klen]
            pos += max(klen, 0)
            vlen, pos = read_varint(body, pos)
            value = None if vlen < 0 else body[pos : pos + vlen]
            pos += max(vlen, 0)
            if end > len(body) or pos > end:
                raise CorruptBatchError("record length does not match its fields")
            out.append(RawRecord(off_delta, h.base_timestamp + ts_delta, key, value,
                                 body[pos:end]))
            pos = end
    except IndexError:
        raise CorruptBatchError("record runs past the end of its batch") from None
    return out


def compress(codec: int, data: bytes) -> bytes:
    """Compress a batch body the way every Kafka client reads it (snappy raw, lz4 frame with
    independent blocks, zstd frame)."""
    import cramjam

    if codec == 0:
        return data
    if codec == 1:
        return bytes(cramjam.gzip.compress(data))
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == 3:  # independent blocks: the Java client refuses linked ones
        c = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        c.compress(data)
        return bytes(c.finish())
    if codec == 4:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def encode_records(
    h: BatchHeader,
    records: list[RawRecord],
    codec: int,
    base_timestamp: int | None = None,
    delete_horizon: bool | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """A v2 batch with `h`'s base offset, last offset delta, leader epoch, producer id, epoch,
    base sequence, timestamp type and max timestamp, holding `records` (possibly fewer than
    `h` had, or none), its body compressed with `codec`, CRC computed.

    `base_timestamp` (default: h's) is what record timestamps are stored relative to;
    `delete_horizon` sets or clears the KIP-534 flag (default: as in h); `max_timestamp`
    replaces h's (a cleaned batch's is that of the records it keeps)."""
    base_ts = h.base_timestamp if base_timestamp is None else base_timestamp
    body = bytearray()
    for r in records:
        rec = bytearray(b"\x00")
        rec += _zigzag(r.timestamp - base_ts) + _zigzag(r.offset_delta)
        rec += _field(r.key) + _field(r.value) + r.headers
        body += _zigzag(len(rec)) + rec
    if not records:
        codec = 0
    attrs = (h.attributes & ~0x07) | codec
    if delete_horizon is not None:
        attrs = (attrs | DELETE_HORIZON_BIT) if delete_horizon else attrs & ~DELETE_HORIZON_BIT
    after_crc = struct.pack(
        ">hiqqqhii",
        attrs,
        h.last_offset_delta,
        base_ts,
        h.max_timestamp if max_timestamp is None else max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        len(records),
    )
    after_crc += compress(codec, bytes(body))
    head = struct.pack(">qiib", h.base_offset, len(after_crc) + 9, h.leader_epoch, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def recompress(batch: bytes | bytearray | memoryview, h: BatchHeader, codec: int) -> bytes:
    """The batch at h.position re-encoded with `codec` (a no-op copy for the same codec),
    keeping every record field, header and the producer id / epoch / sequence."""
    if h.compression == codec or h.is_control:
        return bytes(memoryview(batch)[h.position : h.position + h.size])
    return encode_records(h, decode_raw(batch, h), codec)
