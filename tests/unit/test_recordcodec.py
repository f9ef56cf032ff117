from __future__ import annotations

import pytest

from broker.protocol import records
from broker.protocol.recordcodec import decode_records, encode_batch
from tests.unit.test_records import compressed


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_encode_then_decode_roundtrip(codec: int) -> None:
    recs = [(b"k1", b"v" * 300, [("h", b"x"), ("n", None)]), (None, None, []),
            (b"", b"\xff\x00", [])]
    batch = bytearray(encode_batch(recs, timestamp_ms=1_700_000_000_123))
    if codec:
        batch = compressed(batch, codec)
    (h,) = records.validate(batch)
    records.assign_offsets(batch, [h], 500, None)
    (h,) = records.iter_headers(batch)
    out = decode_records(batch, h)
    assert [r.offset for r in out] == [500, 501, 502]
    assert [(r.key, r.value, list(r.headers)) for r in out] == recs
    assert {r.timestamp for r in out} == {1_700_000_000_123}


def test_log_append_time_applies_to_every_record() -> None:
    batch = bytearray(encode_batch([(None, b"a", []), (None, b"b", [])], timestamp_ms=5))
    hs = records.validate(batch)
    records.assign_offsets(batch, hs, 0, 99_000)
    (h,) = records.iter_headers(batch)
    assert [r.timestamp for r in decode_records(batch, h)] == [99_000, 99_000]


def test_truncated_record_is_corrupt() -> None:
    batch = bytearray(encode_batch([(b"k", b"value", [])]))
    (h,) = records.validate(batch)
    cut = bytearray(batch)
    cut[records.HEADER_SIZE] = 0x7E  # the first record claims to be much longer
    with pytest.raises(records.CorruptBatchError):
        decode_records(cut, h)
