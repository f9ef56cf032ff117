"""The Produce request reader (broker/protocol/producerequest.py), against kio's writer.

What must hold: every request kio writes, at every version the broker serves (3-11), reads
back field for field, with unknown tagged fields skipped and trailing bytes ignored; record
sets are views into the frame (writable when the frame is, so the log writes offsets in place,
no copy); and a hostile frame (truncated, a count or length far beyond its bytes, a varint too
long, a null name, bytes that are not UTF-8, random damage) is a ProtocolError, never another
exception and never an allocation or loop sized by what the frame claims.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import random
import struct
from typing import Any

import pytest
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from broker.protocol.codec import ProtocolError, UnsupportedVersionError, decode_request
from broker.protocol.framecheck import encode_uvarint
from tests.producereq import from_kio
from tests.rawclient import make_batch, request_class

SERVED = (3, 11)
VERSIONS = range(3, 12)


def request(version: int, rng: random.Random) -> Any:
    """A ProduceRequest of `version` with a few topics and partitions, some record sets null
    or empty, names with non-ASCII characters."""
    pd = request_class(0, version, "PartitionProduceData")
    td = request_class(0, version, "TopicProduceData")
    topics = []
    for t in range(rng.randint(0, 3)):
        parts = []
        for _ in range(rng.randint(0, 4)):
            kind = rng.random()
            records = None if kind < 0.15 else b"" if kind < 0.25 else bytes(
                make_batch([rng.randbytes(rng.randint(0, 300)) for _ in range(rng.randint(1, 3))]))
            parts.append(pd(index=i32(rng.randint(0, 2**31 - 1)), records=records))
        topics.append(td(name=f"tópico-{t}-{rng.randint(0, 99)}", partition_data=tuple(parts)))
    return request_class(0, version)(
        transactional_id=rng.choice([None, "", "tx-ü"]),
        acks=i16(rng.choice([-1, 0, 1])),
        timeout=datetime.timedelta(milliseconds=rng.randint(0, 2**31 - 1)),
        topic_data=tuple(topics),
    )


def frame_of(req: Any, client_id: str | None = "c") -> bytes:
    header_cls = RequestHeaderV2 if req.__flexible__ else RequestHeaderV1
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(
        request_api_key=i16(0), request_api_version=i16(req.__version__),
        correlation_id=i32(42), client_id=client_id))
    entity_writer(type(req))(buf, req)
    return buf.getvalue()


def decode(frame: bytes | bytearray) -> Any:
    return decode_request(frame, SERVED)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_reads_back_what_kio_wrote(version: int) -> None:
    rng = random.Random(version)
    for _ in range(40):
        req = request(version, rng)
        client_id = rng.choice([None, "", "rdkafka"])
        head, body = decode(frame_of(req, client_id))
        assert (head.api_key, head.api_version, head.correlation_id, head.client_id) == (
            0, version, 42, client_id)
        assert body == from_kio(req)
        assert decode(frame_of(req, client_id) + b"\0\0\0")[1] == body  # trailing bytes


@pytest.mark.parametrize("version", range(9, 12))
def test_unknown_tagged_fields_are_skipped_everywhere(version: int) -> None:
    """Header, body, topic and partition each end with a tagged-field section (flexible
    versions): unknown fields in any of them are skipped, as Kafka receivers do."""
    pd = request_class(0, version, "PartitionProduceData")
    td = request_class(0, version, "TopicProduceData")
    batch = bytes(make_batch([b"v"]))
    req = request_class(0, version)(
        transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(seconds=1),
        topic_data=(td(name="t", partition_data=(pd(index=i32(0), records=batch),)),))
    frame = frame_of(req, "c")
    unknown = b"\x02" + b"\x05\x03abc" + b"\x63\x00"  # tags 5 (3 bytes) and 99 (empty)
    header_end = 8 + 2 + 1  # fixed fields, client id length and "c"
    records_end = frame.index(batch) + len(batch)
    assert frame[header_end] == 0 and frame[records_end:] == b"\0\0\0"
    variants = [
        frame[:header_end] + unknown + frame[header_end + 1:],
        frame[:records_end] + unknown + b"\0\0",  # the partition's
        frame[:records_end] + b"\0" + unknown + b"\0",  # the topic's
        frame[:records_end] + b"\0\0" + unknown,  # the request's
    ]
    for f in variants:
        assert decode(f)[1] == from_kio(req)


def test_record_sets_are_views_into_the_frame() -> None:
    """No copy: a bytearray frame gives writable views of its own bytes (the log writes the
    base offsets through them); a bytes frame gives read-only ones."""
    req = request(9, random.Random(1))
    while not any(p.records for t in req.topic_data for p in t.partition_data):
        req = request(9, random.Random(random.random()))
    frame = bytearray(frame_of(req))
    body = decode(frame)[1]
    views = [p.records for t in body.topic_data for p in t.partition_data if p.records]
    for v in views:
        assert not v.readonly and v.obj is frame
        v[:8] = struct.pack(">q", 77)
    for t in body.topic_data:
        for p in t.partition_data:
            if p.records:
                assert frame.find(bytes(p.records)) >= 0 and p.records[:8] == struct.pack(">q", 77)
    assert all(p.records is None or p.records.readonly
               for t in decode(bytes(frame))[1].topic_data for p in t.partition_data)


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_every_truncation_is_a_protocol_error(version: int) -> None:
    req = request(version, random.Random(5))
    while not req.topic_data:
        req = request(version, random.Random(random.random()))
    frame = frame_of(req)
    for cut in range(len(frame)):
        try:
            decode(frame[:cut])
        except ProtocolError:
            continue
        raise AssertionError(f"a frame cut to {cut} of {len(frame)} bytes decoded")


@pytest.mark.parametrize("version", [3, 9])
def test_random_damage_is_a_protocol_error_or_a_request(version: int) -> None:
    rng = random.Random(version)
    frame = frame_of(request(version, rng))
    for _ in range(3000):
        damaged = bytearray(frame)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(8, len(damaged))] = rng.randrange(256)
        with contextlib.suppress(ProtocolError):
            decode(damaged)


def _head(version: int) -> bytes:
    flexible = b"\0" if version >= 9 else b""
    return struct.pack(">hhih", 0, version, 1, -1) + flexible


def test_hostile_counts_and_lengths_are_refused() -> None:
    v3 = _head(3) + struct.pack(">hhi", -1, 1, 1000)  # no transactional id, acks, timeout
    v9 = _head(9) + b"\0" + struct.pack(">hi", 1, 1000)
    cases = {
        "v3: 2^31-1 topics": v3 + struct.pack(">i", 2**31 - 1) + b"\0" * 16,
        "v9: 4e9 topics": v9 + encode_uvarint(4_000_000_001) + b"\0" * 16,
        "v3: -2 topics": v3 + struct.pack(">i", -2),
        "v9: null topic array": v9 + b"\0",
        "v3: 2^31-1 partitions": v3 + struct.pack(">ih", 1, 1) + b"t"
        + struct.pack(">i", 2**31 - 1) + b"\0" * 16,
        "v3: records of 2^31-1 bytes": v3 + struct.pack(">ih", 1, 1) + b"t"
        + struct.pack(">iii", 1, 0, 2**31 - 1) + b"x",
        "v9: records of 2^31 bytes": v9 + b"\x02\x02t\x02" + struct.pack(">i", 0)
        + encode_uvarint(2**31) + b"\0" * 8,
        "v3: records of length -2": v3 + struct.pack(">ih", 1, 1) + b"t"
        + struct.pack(">iii", 1, 0, -2),
        "v9: varint of 6 bytes": v9 + b"\xff" * 5 + b"\x01",
        "v9: 2^31 tagged fields in the header": struct.pack(">hhih", 0, 9, 1, -1)
        + encode_uvarint(2**31) + b"\0" * 8,
        "v9: a tagged field of 2^31 bytes": struct.pack(">hhih", 0, 9, 1, -1) + b"\x01\x05"
        + encode_uvarint(2**31) + b"\0" * 8,
        "v3: null topic name": v3 + struct.pack(">ih", 1, -1) + struct.pack(">i", 0),
        "v9: null topic name": v9 + b"\x02\x00\x01\x00" + b"\0",
        "v3: topic name not UTF-8": v3 + struct.pack(">ih", 1, 2) + b"\xc3\x28"
        + struct.pack(">i", 0),
        "client id of 32767 bytes": struct.pack(">hhih", 0, 3, 1, 32767) + b"abc",
        "client id of length -7": struct.pack(">hhih", 0, 3, 1, -7) + b"abc",
    }
    for name, frame in cases.items():
        with pytest.raises(ProtocolError):
            decode(frame)
            pytest.fail(name)


@pytest.mark.parametrize("version", [0, 2, 12, 13])
def test_versions_this_reader_does_not_know_are_unsupported(version: int) -> None:
    with pytest.raises(UnsupportedVersionError):
        decode_request(_head(version) + b"\0" * 16, (0, 20))
