"""broker.protocol.recordset: a fetch's batches as views of their chunks.

What must hold: a Fetch response carrying a RecordSet encodes, at every served version, to
exactly the bytes of the same response carrying the joined records (this pins what the
encoder relies on in kio: a records field is written as len(value) then write(value)), the
chunks' bytes are written by reference, and cutting a set (byte limit, last stable offset)
keeps whole batches as the joined bytes would be cut."""

from __future__ import annotations

import datetime

import pytest
from kio.static.primitive import i32, i64

from broker.errors import ErrorCode
from broker.handlers.base import build, schema_class
from broker.protocol import records
from broker.protocol.codec import encode_response, encode_response_parts, response_type
from broker.protocol.recordset import EMPTY, RecordSet, RecordSetBuilder
from tests.rawclient import make_batch

FETCH = 1


def batch(base: int, n: int, size: int = 10) -> bytes:
    buf = make_batch([f"v{base + i}".encode() * size for i in range(n)])
    records.assign_offsets(buf, records.validate(buf), base, None)
    return bytes(buf)


def chunks() -> list[bytes]:
    """Three chunks of two batches each: offsets 0-5, 6-11, 12-17; the middle one large."""
    return [
        batch(0, 3) + batch(3, 3),
        batch(6, 3, 15000) + batch(9, 3, 15000),
        batch(12, 3) + batch(15, 3),
    ]


def served(chunks: list[bytes], skip_first: int = 0) -> RecordSet:
    out = RecordSetBuilder()
    for c in chunks:
        for h in records.iter_headers(c)[skip_first:]:
            out.add(c, h)
        skip_first = 0
    return out.build()


def fetch_response(version: int, data: object) -> object:
    part = build(
        schema_class(FETCH, version, "PartitionData"),
        partition_index=i32(3),
        error_code=ErrorCode.none,
        high_watermark=i64(18),
        last_stable_offset=i64(18),
        log_start_offset=i64(0),
        aborted_transactions=(),
        preferred_read_replica=i32(-1),
        records=data,
    )
    topic = build(schema_class(FETCH, version, "FetchableTopicResponse"), topic="t",
                  partitions=(part,))
    return build(response_type(FETCH, version), throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode.none, session_id=i32(0), responses=(topic,))


@pytest.mark.parametrize("version", range(4, 13))
def test_a_fetch_response_with_views_is_the_response_with_the_joined_bytes(version: int) -> None:
    cs = chunks()
    views = served(cs, skip_first=1)  # from the second batch of the first chunk
    joined = b"".join(cs)[records.iter_headers(cs[0])[1].position :]
    assert views.tobytes() == joined
    expected = encode_response(FETCH, version, 7, fetch_response(version, joined))
    parts, size = encode_response_parts(FETCH, version, 7, fetch_response(version, views))
    assert b"".join(parts) == expected and size == len(expected)
    assert encode_response(FETCH, version, 7, fetch_response(version, views)) == expected
    # the large chunk goes out as a view of it, not copied into the frame
    assert any(isinstance(p, memoryview) and p.obj is cs[1] for p in parts)
    empty = encode_response(FETCH, version, 7, fetch_response(version, EMPTY))
    assert empty == encode_response(FETCH, version, 7, fetch_response(version, b""))


def test_adjacent_batches_of_a_chunk_are_one_view() -> None:
    cs = chunks()
    s = served(cs)
    assert len(s.parts) == 3 and s.batches == 6
    assert [p.obj for p in s.parts] == cs
    assert all(p.readonly for p in s.parts)


def test_cuts_keep_whole_batches_as_on_the_joined_bytes() -> None:
    cs = chunks()
    s = served(cs)
    data = s.tobytes()
    hs = records.iter_headers(data)
    ends = [h.position + h.size for h in hs]
    for limit in (0, 1, ends[0], ends[0] + 1, ends[2] - 1, ends[2], ends[3], len(data), 10**9):
        n = sum(1 for e in ends if e <= limit)
        for must in (False, True):
            want = ends[max(n, 1) - 1] if (n or must) else 0
            got = s.within(limit, must)
            assert got.tobytes() == data[:want], (limit, must)
            assert len(got) == want and got.batches == (max(n, 1) if must else n)
    # below the last stable offset: batches ending at or above it are left out
    for lso, keep in ((0, 0), (2, 0), (3, 1), (4, 1), (6, 2), (12, 4), (17, 5), (18, 6), (99, 6)):
        assert s.below(lso).tobytes() == data[: (ends[keep - 1] if keep else 0)], lso
    assert not s.below(0) and s.below(0) is EMPTY
    assert s.first(6) is s
