from __future__ import annotations

import struct

import cramjam
import pytest
from crc32c import crc32c

from broker.protocol import records
from tests.rawclient import make_batch

CODECS = {
    1: cramjam.gzip.compress,
    2: cramjam.snappy.compress_raw,
    3: cramjam.lz4.compress,
    4: cramjam.zstd.compress,
}


def compressed(batch: bytearray, codec: int) -> bytearray:
    """The same batch with its records compressed by `codec` (header fixed up, CRC recomputed)."""
    body = bytes(CODECS[codec](bytes(batch[records.HEADER_SIZE :])))
    out = bytearray(batch[: records.HEADER_SIZE]) + body
    struct.pack_into(">i", out, 8, len(out) - records.LOG_OVERHEAD)
    attrs = struct.unpack_from(">h", out, 21)[0] | codec
    struct.pack_into(">h", out, 21, attrs)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return out


def test_validate_counts_and_crc() -> None:
    buf = make_batch([b"a", b"b", b"c"]) + make_batch([b"d"])
    hs = records.validate(buf)
    assert [h.record_count for h in hs] == [3, 1]
    assert hs[1].position == hs[0].size
    broken = bytearray(buf)
    broken[hs[0].size - 1] ^= 1
    with pytest.raises(records.CorruptBatchError, match="CRC"):
        records.validate(broken)
    with pytest.raises(records.CorruptBatchError):
        records.validate(buf[:-3])
    with pytest.raises(records.CorruptBatchError):
        records.validate(b"")


def test_assign_offsets_keeps_crc_valid_and_sets_log_append_time() -> None:
    buf = make_batch([b"a", b"b"]) + make_batch([b"c"])
    hs = records.validate(buf)
    nxt = records.assign_offsets(buf, hs, 100, None)
    assert nxt == 103
    assert [h.base_offset for h in records.validate(buf)] == [100, 102]
    nxt = records.assign_offsets(buf, hs, 7, 1_800_000_000_000)
    after = records.validate(buf)  # CRC recomputed over the changed attributes/max timestamp
    assert all(h.log_append_time and h.max_timestamp == 1_800_000_000_000 for h in after)
    assert records.record_timestamps(buf, after[0]) == [
        (7, 1_800_000_000_000),
        (8, 1_800_000_000_000),
    ]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_record_timestamps_through_every_codec(codec: int) -> None:
    batch = make_batch([b"x" * 50 for _ in range(5)], base_ts_ms=1_000_000)
    if codec:
        batch = compressed(batch, codec)
    (h,) = records.validate(batch)
    assert h.compression == codec
    records.assign_offsets(batch, [h], 40, None)
    (h,) = records.iter_headers(batch)
    assert records.record_timestamps(batch, h) == [(40 + i, 1_000_000 + 1000 * i) for i in range(5)]


def test_snappy_java_framing_is_understood() -> None:
    raw = b"hello kafka " * 100
    block = bytes(cramjam.snappy.compress_raw(raw))
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert records.decompress(2, framed) == raw


def test_magic_other_than_2_is_unsupported() -> None:
    buf = make_batch([b"a"])
    buf[16] = 1
    with pytest.raises(records.UnsupportedMagicError):
        records.validate(buf)
