"""Hostile frames against a real broker process (issue 10, items 6 and 7).

What must survive: the broker process, every other connection (a bystander keeps producing
and fetching), the data it acknowledged. A frame whose lengths claim billions of elements
costs only its own connection (before the fix, kio's native reader asked for 32 GB and Rust
aborted the whole broker); a request carrying tagged fields the broker does not know, in its
header or its body, is answered normally (before, the connection was dropped).
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import time
from typing import Any

import pytest

from tests.brokerproc import BrokerProcess
from tests.integration.test_bad_input import api_versions, create_topic, fetch, produce
from tests.rawclient import RawClient, make_batch, request_class
from tests.unit.test_codec_bounds import frame_of, hostile_frames, metadata_v12

pytestmark = pytest.mark.integration

CORRUPT_MESSAGE = 2
POLICY_VIOLATION = 44


def _size_prefixed(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def test_huge_lengths_cost_only_their_connection(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as bystander:
        assert create_topic(bystander, "calm").error_code == 0
        for i, (name, frame) in enumerate(hostile_frames().items()):
            with RawClient(broker.bootstrap) as bad:
                bad.send_raw(_size_prefixed(frame))
                assert bad.is_closed_by_peer(), name
            assert broker.proc is not None and broker.proc.poll() is None, (name, broker.log())
            # the bystander's connection is untouched and its writes still land
            result = produce(bystander, "calm", {0: make_batch([f"v{i}".encode()])})
            assert result[0].error_code == 0 and result[0].base_offset == i, name
        assert fetch(bystander, "calm", 0).high_watermark == len(hostile_frames())
        lines = [ln for ln in broker.log().splitlines() if "closing connection" in ln]
        assert len(lines) >= len(hostile_frames())
        assert "Traceback" not in broker.log()


def test_unknown_tagged_fields_are_skipped(broker: BrokerProcess) -> None:
    """Metadata v12 and ApiVersions v3 with unknown tags in the header and in the body, and a
    Produce v9 with one inside a partition's struct, are answered as if the tags were absent."""
    unknown = b"\x02" + b"\x05\x03abc" + b"\x63\x00"  # tags 5 (3 bytes) and 99 (empty)
    header_end = 8 + 2 + len("rawclient")

    def with_unknown_tags(frame: bytes) -> bytes:
        assert frame[header_end] == 0 and frame[-1] == 0
        return frame[:header_end] + unknown + frame[header_end + 1 : -1] + unknown

    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "tags").error_code == 0
        for req, check in (
            (metadata_v12(("tags",)), lambda r: [t.name for t in r.topics] == ["tags"]),
            (request_class(18, 3)(client_software_name="x", client_software_version="1"),
             lambda r: r.error_code == 0 and len(r.api_keys) > 10),
        ):
            c.send_raw(_size_prefixed(with_unknown_tags(frame_of(req))))
            _corr, resp = c.decode(c.read_frame(), req.__api_key__, req.__version__)
            assert check(resp), resp
        batch = bytes(make_batch([b"tagged"]))
        frame = frame_of(_produce_to("tags", batch))
        # partition struct: index, records, then its tagged-field count (0) before the end
        # of the partition array; put an unknown tag there
        cut = frame.index(batch) + len(batch)
        assert frame[cut] == 0
        frame = frame[:cut] + b"\x01\x09\x02zz" + frame[cut + 1 :]
        c.send_raw(_size_prefixed(with_unknown_tags(frame)))
        _corr, resp = c.decode(c.read_frame(), 0, 9)
        part = resp.responses[0].partition_responses[0]
        assert part.error_code == 0 and part.base_offset == 0
        stored = fetch(c, "tags", 0)
        assert stored.high_watermark == 1 and b"tagged" in bytes(stored.records)
        assert api_versions(c).error_code == 0  # same connection goes on


def test_a_request_for_millions_of_partitions_is_refused(broker: BrokerProcess) -> None:
    """Found by the wire fuzz: CreateTopics with num_partitions 6,620,931 (one mutated int32)
    held the metadata store for minutes, so every produce and topic creation of every client
    waited. Apache Kafka refuses more than 10,000 new partitions per request with
    POLICY_VIOLATION (KAFKA-17870, KAFKA-19673); so does floe, and nothing is created."""
    with RawClient(broker.bootstrap, timeout=10) as c:
        assert create_topic(c, "huge", partitions=6_620_931).error_code == POLICY_VIOLATION
        assert create_topic(c, "small", partitions=2).error_code == 0
        topics = request_class(37, 3, "CreatePartitionsTopic")
        grow = request_class(37, 3)(
            topics=(topics(name="small", count=2**31 - 1, assignments=None),),
            timeout=datetime.timedelta(seconds=5),
            validate_only=False,
        )
        assert c.request(grow).results[0].error_code == POLICY_VIOLATION
        assert produce(c, "small", {1: make_batch([b"fine"])})[1].error_code == 0
        meta = c.request(metadata_v12(("huge", "small")))
        by_name = {t.name: t for t in meta.topics}
        assert by_name["huge"].error_code != 0 and len(by_name["small"].partitions) == 2


def _produce_to(topic: str, records: bytes) -> Any:
    pd = request_class(0, 9, "PartitionProduceData")
    td = request_class(0, 9, "TopicProduceData")
    return request_class(0, 9)(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(td(name=topic, partition_data=(pd(index=0, records=records),)),),
    )


def zstd_rle_bomb(n: int) -> bytes:
    """A valid zstd frame that inflates to `n` zero bytes from 4 bytes per 128 KiB (RLE
    blocks): 3 GiB take 96 KB, well within max.message.bytes."""
    block = 128 << 10
    out = bytearray(b"\x28\xb5\x2f\xfd\x00\x38")  # magic, no content size, 128 KiB window
    left = n
    while left > 0:
        k = min(block, left)
        left -= k
        header = (1 if left == 0 else 0) | (1 << 1) | (k << 3)  # last?, RLE, size
        out += header.to_bytes(3, "little") + b"\0"
    return bytes(out)


def compressed_batch(codec: int, records: bytes, timestamp_ms: int) -> bytes:
    """A v2 batch of one record whose records section is `records`, with a correct CRC."""
    from crc32c import crc32c

    after_crc = struct.pack(">hiqqqhii", codec, 0, timestamp_ms, timestamp_ms, -1, -1, -1, 1)
    body = after_crc + records
    crc = crc32c(body)
    return struct.pack(">qiibI", 0, 49 + len(records), -1, 2, crc) + body


def test_decompression_bomb_costs_only_its_request(broker: BrokerProcess) -> None:
    """96 KB of zstd claiming 3 GiB, stored with a valid CRC, then read by ListOffsets by
    timestamp: before, cramjam inflated it whole and (with the address space capped at 1 GiB
    above the broker's) Rust aborted the broker; now it is corrupt beyond 256 MiB, the request
    fails alone and the broker serves the next one."""
    import resource

    from tests.integration.test_wire_fuzz import proc_status

    assert broker.proc is not None
    limit = proc_status(broker.proc.pid)["VmSize"] + (1 << 30)
    resource.prlimit(broker.proc.pid, resource.RLIMIT_AS, (limit, limit))
    now_ms = 1_700_000_000_000
    with RawClient(broker.bootstrap, timeout=30) as c:
        assert create_topic(c, "bomb").error_code == 0
        batch = compressed_batch(4, zstd_rle_bomb(3 << 30), now_ms)
        assert produce(c, "bomb", {0: batch})[0].error_code == 0
    lo_topic = request_class(2, 7, "ListOffsetsTopic")
    lo_part = request_class(2, 7, "ListOffsetsPartition")
    by_time = request_class(2, 7)(
        replica_id=-1, isolation_level=0,
        topics=(lo_topic(name="bomb", partitions=(lo_part(partition_index=0,
                                                          timestamp=now_ms - 1),)),),
    )
    with RawClient(broker.bootstrap, timeout=30) as c:
        try:
            part = c.request(by_time).topics[0].partitions[0]
            assert part.error_code != 0  # an error for this partition is fine too
        except ConnectionError:
            pass  # the request cost its connection
    time.sleep(0.5)  # an abort takes a moment to show
    assert broker.proc.poll() is None, broker.log()[-3000:]
    with RawClient(broker.bootstrap) as c:
        assert produce(c, "bomb", {0: make_batch([b"after"])})[0].error_code == 0
        assert fetch(c, "bomb", 0).high_watermark == 2


def test_null_topics_in_fetch_cost_only_the_connection_quietly(broker: BrokerProcess) -> None:
    """Found by the wire fuzz: Fetch v12 with a null (non-nullable) topics array reached the
    handler as None and its deferred response failed with TypeError. Behind a long-polling
    fetch on the same connection, and with the connection closed by the next (garbage)
    frame, nobody awaited it: "Task exception was never retrieved" and a traceback in the
    log. Now the frame is refused at decode, and any deferred response's error is noted even
    when its connection is gone: one log line per connection, the broker serves on."""
    from tests.unit.test_codec_bounds import fetch_v12

    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "quiet").error_code == 0
    fp = request_class(1, 12, "FetchPartition")
    ft = request_class(1, 12, "FetchTopic")
    long_poll = dataclasses.replace(
        fetch_v12(), max_wait=datetime.timedelta(seconds=3),
        topics=(ft(topic="quiet", partitions=(fp(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1000),)),),
    )
    frame = frame_of(fetch_v12())
    null_topics = frame[:-4] + b"\x00" + frame[-3:]
    garbage = b"\x00\x01\x00\x0c" + b"\x99" * 12  # a frame that closes the connection
    for _ in range(10):
        with RawClient(broker.bootstrap) as bad:
            bad.send_raw(_size_prefixed(frame_of(long_poll)) + _size_prefixed(null_topics)
                         + _size_prefixed(garbage))
            assert bad.is_closed_by_peer()
    with RawClient(broker.bootstrap) as c:
        assert api_versions(c).error_code == 0
        time.sleep(3.5)  # the long polls end; an unretrieved error is logged when collected
        assert api_versions(c).error_code == 0
    log = broker.log()
    assert "Traceback" not in log and "never retrieved" not in log, log[-3000:]
    assert log.count("closing connection from") >= 10


def test_a_batch_claiming_billions_of_records_is_refused(broker: BrokerProcess) -> None:
    """One record, a header claiming 2^31-1 (count and last offset delta agreeing, CRC
    valid): before, the broker stored it and moved the log end offset by 2^31-1, and a
    LogAppendTime read of it built a list of 2^31 entries. Now CORRUPT_MESSAGE, nothing
    stored, the next record gets offset 0."""
    from tests.unit.test_record_count_bounds import claiming

    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "liar").error_code == 0
        lie = claiming(make_batch([b"one"]), 2**31 - 1, attributes=0x08)  # LogAppendTime bit
        assert produce(c, "liar", {0: lie})[0].error_code == CORRUPT_MESSAGE
        ok = produce(c, "liar", {0: make_batch([b"two"])})[0]
        assert ok.error_code == 0 and ok.base_offset == 0
        assert fetch(c, "liar", 0).high_watermark == 1
