"""A batch's record count is bounded by its bytes (broker/protocol/records.py).

What must hold: a CRC-valid batch whose header claims more records than its bytes can hold
is corrupt at produce (it would move the log end offset by billions and make readers that go
by the count allocate per claimed record); readers of stored batches (ListOffsets by time,
timestamp policy checks) look only at the records that are there, LogAppendTime or not.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from broker.protocol import records
from tests.rawclient import make_batch


def claiming(batch: bytearray, count: int, attributes: int | None = None) -> bytearray:
    """`batch` with its record count and last offset delta set to `count`, CRC fixed."""
    out = bytearray(batch)
    struct.pack_into(">i", out, 23, count - 1)
    struct.pack_into(">i", out, 57, count)
    if attributes is not None:
        struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return out


def test_a_count_beyond_what_the_bytes_hold_is_corrupt() -> None:
    one = make_batch([b"v"])
    (h,) = records.validate(one)
    assert h.record_count == 1
    fits = records.max_records(h)
    assert fits == (h.size - records.HEADER_SIZE) // records.MIN_RECORD_SIZE
    for count in (fits + 1, 1_000_000, 2**31 - 1):
        with pytest.raises(records.CorruptBatchError, match="cannot fit"):
            records.validate(claiming(one, count))
    assert records.validate(claiming(one, fits))[0].record_count == fits


@pytest.mark.parametrize("log_append_time", [False, True])
def test_record_timestamps_read_only_the_records_that_are_there(log_append_time: bool) -> None:
    """Before, a LogAppendTime batch yielded one entry per claimed record without reading
    any: 2^31 claimed, a list of 2^31 tuples."""
    three = make_batch([b"a", b"b", b"c"], base_ts_ms=1_000_000)
    attrs = records.TIMESTAMP_TYPE_BIT if log_append_time else 0
    (h,) = records.iter_headers(claiming(three, 3, attrs))
    expected_ts = [h.max_timestamp] * 3 if log_append_time else [1_000_000 + 1000 * i
                                                                 for i in range(3)]
    assert records.record_timestamps(claiming(three, 3, attrs), h) == list(
        zip(range(3), expected_ts, strict=True))
    lying = claiming(three, 1_000_000, attrs)
    (h,) = records.iter_headers(lying)
    with pytest.raises(records.CorruptBatchError):
        records.record_timestamps(lying, h)
