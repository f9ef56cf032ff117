"""The bounded walk in front of kio's native decoder (broker/protocol/framecheck.py).

What must hold: every request a real client sends decodes exactly as before; no length, count
or varint in a frame can make the decoder reserve memory beyond a small multiple of the frame
(kio's Rust reader would reserve 8 bytes per claimed array element, and Rust aborts the
process when that fails); unknown tagged fields are skipped, in the request header, in the
body and in nested structs, as the Kafka protocol requires of a receiver.
"""

from __future__ import annotations

import datetime
import io
import struct
from typing import Any

import pytest
from kio.index import api_key_map, load_entity_schema, load_request_schema
from kio.schema.index import schema_name_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32

from broker.protocol.codec import ProtocolError, decode_request
from broker.protocol.consumer import subscription_topics
from broker.protocol.framecheck import (
    MAX_ARRAY_ELEMENTS,
    MalformedFrame,
    check_entity,
    check_request,
    encode_uvarint,
    plan_for,
)
from tests.producereq import same
from tests.rawclient import make_batch, request_class

ALL = (0, 20)  # a version range wide enough for every request built below


def frame_of(req: Any, client_id: str = "rawclient") -> bytes:
    """The request as a client sends it, without the 4-byte size prefix."""
    header_cls = RequestHeaderV2 if req.__flexible__ else RequestHeaderV1
    buf = io.BytesIO()
    entity_writer(header_cls)(
        buf,
        header_cls(request_api_key=req.__api_key__, request_api_version=req.__version__,
                   correlation_id=i32(7), client_id=client_id),
    )
    entity_writer(type(req))(buf, req)
    return buf.getvalue()


def metadata_v12(topics: tuple[str, ...] | None) -> Any:
    topic = request_class(3, 12, "MetadataRequestTopic")
    return request_class(3, 12)(
        topics=None if topics is None else tuple(topic(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def produce(version: int, records: bytes) -> Any:
    pd = request_class(0, version, "PartitionProduceData")
    td = request_class(0, version, "TopicProduceData")
    return request_class(0, version)(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(td(name="t", partition_data=(pd(index=0, records=records),)),),
    )


def create_topics_v7() -> Any:
    topic = request_class(19, 7, "CreatableTopic")
    cfg = request_class(19, 7, "CreatableTopicConfig")
    return request_class(19, 7)(
        topics=(
            topic(name="a", num_partitions=3, replication_factor=1, assignments=(),
                  configs=(cfg(name="retention.ms", value="1000"),)),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )


def real_requests() -> list[Any]:
    batch = bytes(make_batch([b"v" * 100, b"w"]))
    return [
        metadata_v12(None),
        metadata_v12(("a", "b")),
        request_class(3, 1)(topics=None),
        produce(9, batch),
        produce(3, batch),
        create_topics_v7(),
        request_class(18, 3)(client_software_name="x", client_software_version="1"),
        request_class(18, 0)(),
    ]


def test_every_request_schema_has_a_plan() -> None:
    """Every request kio knows (all api keys, all versions) compiles to a walk plan."""
    n = 0
    for key, name in api_key_map.items():
        for version in schema_name_map[name]:
            req = load_request_schema(key, version)
            assert plan_for(req).name == req.__name__
            plan_for(req.__header_schema__)
            n += 1
    assert n > 200


@pytest.mark.parametrize("req", real_requests(), ids=lambda r: f"{type(r).__name__}")
def test_real_requests_pass_unchanged(req: Any) -> None:
    frame = frame_of(req)
    assert check_request(frame, req.__header_schema__, type(req)) is frame
    _head, body = decode_request(frame, ALL)
    assert same(body, req)
    # Bytes after the body are ignored, as Apache Kafka does (librdkafka sends some).
    _head, body = decode_request(frame + b"\0\0\0", ALL)
    assert same(body, req)


def hostile_frames() -> dict[str, bytes]:
    """Frames whose lengths claim far more than they carry; the first one made kio's native
    reader ask for 32 GB and abort the process."""
    hdr_v2 = struct.pack(">hhih", 3, 12, 1, -1) + b"\0"
    hdr_v1 = struct.pack(">hhih", 3, 1, 1, -1)
    create = frame_of(create_topics_v7())
    prod = frame_of(produce(9, bytes(make_batch([b"x"]))))
    return {
        "metadata v12 compact array of 4e9 topics": hdr_v2 + encode_uvarint(4_000_000_001)
        + b"\0" * 8,
        "metadata v12 compact array of 2^35-1 (longest varint)": hdr_v2 + b"\xff" * 4 + b"\x7f"
        + b"\0" * 8,
        "metadata v12 varint of 10 bytes": hdr_v2 + b"\xff" * 9 + b"\x01" + b"\0" * 8,
        "metadata v1 array of 2^31-1 topics": hdr_v1 + struct.pack(">i", 2**31 - 1) + b"\0" * 8,
        "metadata v1 array of -2 topics": hdr_v1 + struct.pack(">i", -2) + b"\0" * 8,
        "metadata v12 topic name of 2^31 bytes": hdr_v2 + b"\x02" + b"\0" * 16
        + encode_uvarint(2**31) + b"abc",
        "client id of 32767 bytes": struct.pack(">hhih", 3, 12, 1, 32767) + b"abc",
        "client id of length -7": struct.pack(">hhih", 3, 12, 1, -7) + b"abc",
        "header with 2^31 tagged fields": struct.pack(">hhih", 3, 12, 1, -1)
        + encode_uvarint(2**31) + b"\0" * 8,
        "header tagged field of 2^31 bytes": struct.pack(">hhih", 3, 12, 1, -1) + b"\x01\x05"
        + encode_uvarint(2**31) + b"\0" * 8,
        "create topics: config array of 4e9": _replace_first(
            create, b"\x02\x0dretention.ms", encode_uvarint(4_000_000_001) + b"\x0dretention.ms"
        ),
        "produce v9: records of 2^31 bytes": prod[:-80] + encode_uvarint(2**31) + b"\0" * 8,
        "produce v3: records of 2^31-1 bytes": frame_of(produce(3, b"x"))[:-5]
        + struct.pack(">i", 2**31 - 1) + b"x",
    }


def _replace_first(frame: bytes, old: bytes, new: bytes) -> bytes:
    assert old in frame
    return frame.replace(old, new, 1)


@pytest.mark.parametrize("name", list(hostile_frames()))
def test_hostile_lengths_are_refused_before_kio_allocates(name: str) -> None:
    frame = hostile_frames()[name]
    with pytest.raises(ProtocolError):
        decode_request(frame, ALL)


def test_array_counts_are_checked_against_the_smallest_element() -> None:
    """A count that could only fit if each element took less than its smallest encoding is
    refused: 10 topics of Metadata v1 need at least 20 bytes (one int16 length each)."""
    hdr = struct.pack(">hhih", 3, 1, 1, -1)
    ten_names = b"".join(struct.pack(">h", 1) + b"a" for _ in range(10))
    ok = hdr + struct.pack(">i", 10) + ten_names
    assert [t.name for t in decode_request(ok, ALL)[1].topics] == ["a"] * 10
    with pytest.raises(ProtocolError, match="cannot fit"):
        decode_request(hdr + struct.pack(">i", 11) + ten_names[:20], ALL)


def test_unknown_tagged_fields_are_skipped_in_header_and_body() -> None:
    """Kafka: a receiver ignores tagged fields it does not know (how newer clients talk to
    older brokers). Before the fix kio raised KeyError('Unknown tagged field tag: N')."""
    req = metadata_v12(("a",))
    frame = frame_of(req)
    header_end = 8 + 2 + len("rawclient")
    assert frame[header_end] == 0 and frame[-1] == 0
    unknown = b"\x02" + b"\x05\x03abc" + b"\x63\x00"  # tags 5 (3 bytes) and 99 (empty)
    in_header = frame[:header_end] + unknown + frame[header_end + 1 :]
    in_body = frame[:-1] + unknown
    both = in_header[:-1] + unknown
    for f in (in_header, in_body, both):
        assert decode_request(f, ALL)[1] == req


def test_unknown_tagged_field_in_a_nested_struct_and_inside_a_known_one() -> None:
    """An unknown tag inside a nested struct is cut out; one nested in a known tagged struct
    is cut out too, and the known field's size is rewritten to match."""
    req = create_topics_v7()
    frame = frame_of(req)
    cfg_end = frame.index(b"1000") + 4  # value of the config, then its tagged-field count
    assert frame[cfg_end] == 0
    nested = frame[:cfg_end] + b"\x01\x07\x02hi" + frame[cfg_end + 1 :]
    assert decode_request(nested, ALL)[1] == req


def test_known_tagged_struct_holding_an_unknown_tag_is_resized() -> None:
    """Fetch v15's tagged struct replica_state (tag 1) has its own tagged fields: an unknown
    tag inside it is cut out and the known field's size rewritten, so kio reads the same
    request as without it."""
    fetch = load_request_schema(1, 15)
    replica_state = request_class(1, 15, "ReplicaState")
    req = fetch(max_wait=datetime.timedelta(milliseconds=5), min_bytes=1, max_bytes=100,
                isolation_level=0, session_id=0, session_epoch=-1, topics=(),
                forgotten_topics_data=(), rack_id="",
                replica_state=replica_state(replica_id=3, replica_epoch=9))
    frame = frame_of(req)
    # the body's tagged section is last: count 1, tag 1, size, then the struct (4+8 bytes and
    # its own empty tagged section)
    size = 4 + 8 + 1
    tail = b"\x01\x01" + bytes([size]) + struct.pack(">iq", 3, 9) + b"\x00"
    assert frame.endswith(tail)
    grown = frame[: -len(tail)] + b"\x01\x01" + bytes([size + 3]) + struct.pack(">iq", 3, 9) \
        + b"\x01\x2a\x01z"
    checked = check_request(grown, fetch.__header_schema__, fetch)
    assert checked == frame
    _hdr, n = entity_reader(fetch.__header_schema__)(checked, 0)
    assert entity_reader(fetch)(checked, n)[0] == req


def test_unknown_tagged_field_whose_size_runs_past_the_end_is_refused() -> None:
    req = request_class(18, 3)(client_software_name="x", client_software_version="1")
    frame = frame_of(req)
    header_end = 8 + 2 + len("rawclient")
    bad = frame[:header_end] + b"\x01\x05" + encode_uvarint(200) + b"abc" \
        + frame[header_end + 1 :]
    with pytest.raises(ProtocolError, match="runs past"):
        decode_request(bad, ALL)


def test_tagged_field_count_mismatch_and_bad_struct_marker() -> None:
    frame = frame_of(metadata_v12(None))
    with pytest.raises(ProtocolError):
        decode_request(frame[:-1] + b"\x03\x05\x00", ALL)  # 3 fields announced, 1 present


def test_consumer_subscription_with_a_huge_topic_count_is_unreadable_not_fatal() -> None:
    """JoinGroup carries the consumer's subscription as opaque bytes that the coordinator
    decodes with kio too: the same bound applies there."""
    cls = load_entity_schema("consumer_protocol_subscription", 1, EntityType.data)
    buf = io.BytesIO()
    entity_writer(cls)(buf, cls(topics=("t1", "t2"), user_data=None, owned_partitions=()))
    good = struct.pack(">h", 1) + buf.getvalue()
    assert subscription_topics(good) == {"t1", "t2"}
    bad = struct.pack(">h", 1) + struct.pack(">i", 2**31 - 1) + b"\0" * 16
    assert subscription_topics(bad) == set()
    with pytest.raises(MalformedFrame):
        check_entity(bad, 2, cls)


def test_null_where_the_schema_has_no_null_is_refused() -> None:
    """Found by the wire fuzz: Fetch v12 with a null topics array decoded to topics=None and
    the handler died on it. Apache Kafka's readers refuse a null for a non-nullable array,
    string or bytes; so does the walk. Nullable ones (Metadata topics, client id) still pass."""
    fetch = frame_of(fetch_v12())
    assert fetch.endswith(b"\x01\x01\x01\x00")  # topics, forgotten topics, rack id: empty
    topics_at = len(fetch) - 4
    null_topics = fetch[:topics_at] + b"\x00" + fetch[topics_at + 1 :]
    assert decode_request(fetch, ALL)[1] == fetch_v12()
    with pytest.raises(ProtocolError, match="topics: null"):
        decode_request(null_topics, ALL)
    legacy = frame_of(request_class(3, 1)(topics=None))  # nullable in Metadata v1+
    assert decode_request(legacy, ALL)[1].topics is None
    create = frame_of(create_topics_v7())
    null_name = _replace_first(create, b"\x02a", b"\x00")
    with pytest.raises(ProtocolError, match="name: null"):
        decode_request(null_name, ALL)
    anonymous = frame_of(metadata_v12(None), client_id="")
    assert decode_request(anonymous, ALL)[0].client_id == ""


def fetch_v12() -> Any:
    return request_class(1, 12)(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10),
        min_bytes=1, max_bytes=1000, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(), forgotten_topics_data=(), rack_id="",
    )


def test_a_million_array_elements_is_the_most_one_request_may_hold() -> None:
    """Each element costs a Python object and ~0.4 us of the event loop: 50 million 2-byte
    topics in a 100 MiB Metadata frame would stall every client for half a minute and take
    gigabytes. One over the limit is refused before any element is looked at; nested and
    tagged arrays count toward the same total."""
    hdr = struct.pack(">hhih", 3, 1, 1, -1)
    n = MAX_ARRAY_ELEMENTS + 1
    with pytest.raises(ProtocolError, match="array elements in one request"):
        decode_request(hdr + struct.pack(">i", n) + b"\x00\x00" * n, ALL)
    topic = request_class(19, 7, "CreatableTopic")
    cfg = request_class(19, 7, "CreatableTopicConfig")
    many = request_class(19, 7)(
        topics=tuple(
            topic(name=f"t{i}", num_partitions=1, replication_factor=1, assignments=(),
                  configs=tuple(cfg(name="k", value="v") for _ in range(10)))
            for i in range(3)
        ),
        timeout=datetime.timedelta(seconds=1),
        validate_only=False,
    )
    frame = frame_of(many)
    assert check_request(frame, many.__header_schema__, type(many)) is frame
    with pytest.MonkeyPatch.context() as mp:  # 3 topics + 30 configs = 33 elements
        mp.setattr("broker.protocol.framecheck.MAX_ARRAY_ELEMENTS", 33)
        assert check_request(frame, many.__header_schema__, type(many)) is frame
        mp.setattr("broker.protocol.framecheck.MAX_ARRAY_ELEMENTS", 32)
        with pytest.raises(MalformedFrame, match="more than 32 array elements"):
            check_request(frame, many.__header_schema__, type(many))
