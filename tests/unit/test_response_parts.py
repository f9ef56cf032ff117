"""Responses are written as parts: a record set goes out by reference, not copied into the
frame (broker.protocol.codec.encode_response_parts), and the parts make the same frame."""

from __future__ import annotations

import datetime

from kio.schema.fetch.v12 import response as fetch_v12
from kio.static.primitive import i32, i64

from broker.errors import ErrorCode
from broker.protocol.codec import encode_response, encode_response_parts

FETCH = 1


def test_a_record_set_is_written_by_reference() -> None:
    records = bytes(range(256)) * 1024  # 256 KiB
    part = fetch_v12.PartitionData(
        partition_index=i32(3),
        error_code=ErrorCode.none,
        high_watermark=i64(10),
        last_stable_offset=i64(10),
        log_start_offset=i64(0),
        aborted_transactions=(),
        preferred_read_replica=i32(-1),
        records=records,
    )
    resp = fetch_v12.FetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=i32(0),
        responses=(fetch_v12.FetchableTopicResponse(topic="t", partitions=(part,)),),
    )
    parts, size = encode_response_parts(FETCH, 12, 9, resp)
    assert any(p is records for p in parts)
    frame = encode_response(FETCH, 12, 9, resp)
    assert b"".join(parts) == frame and size == len(frame)
