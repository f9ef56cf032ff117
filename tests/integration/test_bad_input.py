"""Bad input gets Kafka's answer and loses nothing; the broker keeps serving everyone else.

Each test says what must survive: the broker process, other connections, and data already
acknowledged; nothing from a rejected request is stored.
"""

from __future__ import annotations

import datetime
import struct

import pytest

from tests.brokerproc import BrokerProcess, running_broker
from tests.rawclient import RawClient, make_batch, request_class

pytestmark = pytest.mark.integration

CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_VERSION = 35
INVALID_CONFIG = 40
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
MESSAGE_TOO_LARGE = 10
TOPIC_ALREADY_EXISTS = 36


def api_versions(c: RawClient) -> object:
    return c.request(request_class(18, 3)(client_software_name="t", client_software_version="1"))


def create_topic(
    c: RawClient, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> object:
    topic = request_class(19, 7, "CreatableTopic")
    cfg = request_class(19, 7, "CreatableTopicConfig")
    req = request_class(19, 7)(
        topics=(
            topic(
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                assignments=(),
                configs=tuple(cfg(name=k, value=v) for k, v in (configs or {}).items()),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    return c.request(req).topics[0]


def produce(c: RawClient, topic: str, parts: dict[int, bytes | bytearray]) -> dict[int, object]:
    pd = request_class(0, 9, "PartitionProduceData")
    td = request_class(0, 9, "TopicProduceData")
    req = request_class(0, 9)(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            td(
                name=topic,
                partition_data=tuple(pd(index=p, records=bytes(data)) for p, data in parts.items()),
            ),
        ),
    )
    resp = c.request(req)
    return {p.index: p for p in resp.responses[0].partition_responses}


def fetch(c: RawClient, topic: str, partition: int, offset: int = 0) -> object:
    fp = request_class(1, 12, "FetchPartition")
    ft = request_class(1, 12, "FetchTopic")
    req = request_class(1, 12)(
        cluster_id=None,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=10),
        min_bytes=1,
        max_bytes=10_000_000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            ft(
                topic=topic,
                partitions=(
                    fp(
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1_000_000,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    return c.request(req).responses[0].partitions[0]


def still_serving(broker: BrokerProcess) -> None:
    assert broker.proc is not None and broker.proc.poll() is None, broker.log()
    with RawClient(broker.bootstrap) as c:
        assert api_versions(c).error_code == 0


def test_garbage_bytes_close_only_that_connection(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as bystander, RawClient(broker.bootstrap) as bad:
        assert api_versions(bystander).error_code == 0
        bad.send_raw(b"\xff\xfe\xfd\xfc GET / HTTP/1.1\r\n\r\n")
        assert bad.is_closed_by_peer()
        assert api_versions(bystander).error_code == 0  # the other connection is untouched
    still_serving(broker)


def test_frame_with_valid_size_but_garbage_header_is_closed(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as bad:
        body = b"\x00\x03\x00\x0c" + b"\x99" * 20  # Metadata v12 followed by nonsense
        bad.send_raw(struct.pack(">i", len(body)) + body)
        assert bad.is_closed_by_peer()
    still_serving(broker)


def test_truncated_frame_then_disconnect(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as bad:
        bad.send_raw(struct.pack(">i", 1000) + b"\x00\x12\x00\x03partial")
    with RawClient(broker.bootstrap) as short:
        short.send_raw(struct.pack(">i", 2) + b"\x00\x12")  # shorter than a request header
        assert short.is_closed_by_peer()
    still_serving(broker)


def test_oversized_frame_is_refused_without_reading_it(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    with running_broker(tmp_path / "d", "--set", "socket.request.max.bytes=4096") as broker:
        with RawClient(broker.bootstrap) as bad:
            bad.send_raw(struct.pack(">i", 5000) + b"\x00" * 100)
            assert bad.is_closed_by_peer()
        with RawClient(broker.bootstrap) as fine:
            assert api_versions(fine).error_code == 0


def test_unknown_api_key_and_version(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        body = struct.pack(">hhih", 999, 0, 1, -1)
        c.send_raw(struct.pack(">i", len(body)) + body)
        assert c.is_closed_by_peer()
    with RawClient(broker.bootstrap) as c:
        body = struct.pack(">hhih", 3, 99, 1, -1)  # Metadata v99
        c.send_raw(struct.pack(">i", len(body)) + body)
        assert c.is_closed_by_peer()
    with RawClient(broker.bootstrap) as c:
        # ApiVersions at a version from the future: Kafka answers v0 with UNSUPPORTED_VERSION
        # and its version ranges, so the client can retry with a version both know.
        body = struct.pack(">hhih", 18, 99, 7, -1) + b"\x00\x00"
        c.send_raw(struct.pack(">i", len(body)) + body)
        correlation, resp = c.decode(c.read_frame(), 18, 0)
        assert correlation == 7
        assert resp.error_code == UNSUPPORTED_VERSION
        ranges = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert ranges[18][0] == 0 and ranges[0][0] <= 3 <= ranges[0][1]
        assert api_versions(c).error_code == 0  # same connection goes on
    still_serving(broker)


def test_corrupt_crc_is_rejected_and_nothing_is_stored(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "crc", partitions=2).error_code == 0
        good = make_batch([b"good-1", b"good-2"])
        bad = make_batch([b"bad-1", b"bad-2"])
        bad[-1] ^= 0xFF  # flip a bit in the last record: CRC no longer matches
        result = produce(c, "crc", {0: good, 1: bad})
        assert result[0].error_code == 0 and result[0].base_offset == 0
        assert result[1].error_code == CORRUPT_MESSAGE
        assert fetch(c, "crc", 1).high_watermark == 0  # nothing of the bad batch stored
        stored = fetch(c, "crc", 0)
        assert stored.high_watermark == 2 and b"good-2" in bytes(stored.records)
        # a batch cut short is corrupt as well
        short = produce(c, "crc", {0: good[:-5]})
        assert short[0].error_code == CORRUPT_MESSAGE
        magic1 = bytearray(good)
        magic1[16] = 1
        assert produce(c, "crc", {0: magic1})[0].error_code == UNSUPPORTED_FOR_MESSAGE_FORMAT
        assert fetch(c, "crc", 0).high_watermark == 2
    still_serving(broker)


def test_produce_to_unknown_partition_or_topic(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "known", partitions=1).error_code == 0
        batch = make_batch([b"v"])
        assert produce(c, "known", {5: batch})[5].error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert produce(c, "nope", {0: batch})[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert fetch(c, "known", 0).high_watermark == 0


def test_topic_names_and_configs_kafka_rejects(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        for name in ("bad/name", "a" * 250, "..", "", "spaces are bad"):
            assert create_topic(c, name).error_code == INVALID_TOPIC_EXCEPTION, name
        assert create_topic(c, "ok.name_1-x").error_code == 0
        assert create_topic(c, "ok.name_1-x").error_code == TOPIC_ALREADY_EXISTS
        r = create_topic(c, "cfg", configs={"no.such.config": "1"})
        assert r.error_code == INVALID_CONFIG
        r = create_topic(c, "cfg", configs={"retention.ms": "soon"})
        assert r.error_code == INVALID_CONFIG
        meta = c.request(
            request_class(3, 12)(
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        assert sorted(t.name for t in meta.topics) == ["ok.name_1-x"]


def test_batch_over_max_message_bytes(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "small", configs={"max.message.bytes": "1000"}).error_code == 0
        assert produce(c, "small", {0: make_batch([b"x" * 2000])})[0].error_code == (
            MESSAGE_TOO_LARGE
        )
        assert produce(c, "small", {0: make_batch([b"x" * 100])})[0].error_code == 0
