"""kafka-python against a real floe broker process.

kafka-python compresses snappy / lz4 / zstd through the optional PyPI packages `python-snappy`,
`lz4` and `zstandard`; a codec whose package is missing is skipped with a reason naming it.
"""

from __future__ import annotations

import socket
import struct
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from tests.brokerproc import BrokerProcess
from tests.integration.workload import (
    BASE_TS_MS,
    CODECS,
    Consumed,
    Rec,
    check_consumed,
    expected_records,
)

# kafka-python 3.0 loads its protocol schemas with importlib.resources.read_text, deprecated in
# Python 3.11+; the warning is attributed to importlib, not to kafka, so the project-wide
# 'ignore::DeprecationWarning:kafka.*' does not catch it.
_KAFKA_SCHEMA_WARNING = "open_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", _KAFKA_SCHEMA_WARNING, DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka import codec as kafka_codec
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.consumer.fetcher import ConsumerRecord
    from kafka.errors import (
        InvalidConfigurationError,
        InvalidTopicError,
        TopicAlreadyExistsError,
        UnknownTopicOrPartitionError,
    )
    from kafka.producer.future import RecordMetadata
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
    from kafka.protocol.producer import ProduceRequest, ProduceResponse
    from kafka.record.memory_records import MemoryRecordsBuilder

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(f"ignore:{_KAFKA_SCHEMA_WARNING}:DeprecationWarning"),
]

N = 10_000
PARTITIONS = 3
TIMEOUT_S = 30.0

CREATE_TIME = 0
LOG_APPEND_TIME = 1
UNKNOWN_TOPIC_OR_PARTITION = 3

# codec -> (available?, the PyPI package kafka-python needs for it)
CODEC_SUPPORT = {
    "none": (True, ""),
    "gzip": (kafka_codec.has_gzip(), ""),
    "snappy": (kafka_codec.has_snappy(), "python-snappy"),
    "lz4": (kafka_codec.has_lz4(), "lz4"),
    "zstd": (kafka_codec.has_zstd(), "zstandard"),
}


def require_codec(codec: str) -> None:
    available, package = CODEC_SUPPORT[codec]
    if not available:
        pytest.skip(f"kafka-python needs the PyPI package {package!r} for {codec}: not installed")


# ---------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    try:
        yield client
    finally:
        client.close()


def create_topic(
    admin: KafkaAdminClient,
    name: str,
    partitions: int = PARTITIONS,
    configs: dict[str, str] | None = None,
) -> None:
    admin.create_topics(
        {name: {"num_partitions": partitions, "replication_factor": 1, "configs": configs or {}}}
    )
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        (t,) = admin.describe_topics([name])
        if t["error_code"] == 0 and len(t["partitions"]) == partitions:
            return
        assert time.monotonic() < deadline, f"{name} not in metadata: {t}"
        time.sleep(0.1)


def topic_configs(admin: KafkaAdminClient, name: str, config_filter: str = "all") -> dict:
    result = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name)], config_filter=config_filter
    )
    return result["topic"][name]


def produce(
    broker: BrokerProcess, topic: str, records: list[Rec], codec: str, **extra: Any
) -> list[RecordMetadata]:
    """kafka-python's defaults: idempotence on (InitProducerId, sequence numbers) unless
    `enable_idempotence=False` is passed."""
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
        **extra,
    )
    try:
        futures = [
            producer.send(
                topic,
                value=r.value,
                key=r.key,
                partition=r.partition,
                timestamp_ms=r.timestamp_ms,
                headers=list(r.headers),
            )
            for r in records
        ]
        producer.flush(timeout=TIMEOUT_S)
        return [f.get(timeout=TIMEOUT_S) for f in futures]
    finally:
        producer.close(timeout=10)


def check_metadata(records: list[Rec], metas: list[RecordMetadata]) -> None:
    per_partition: dict[int, list[int]] = defaultdict(list)
    for r, m in zip(records, metas, strict=True):
        assert m.partition == r.partition
        per_partition[m.partition].append(m.offset)
    for p, offsets in per_partition.items():
        assert offsets == list(range(len(offsets))), f"p{p} offsets not dense from 0"


def new_consumer(broker: BrokerProcess) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=30_000,
    )


def consume(broker: BrokerProcess, topic: str, partitions: range, count: int) -> list:
    consumer = new_consumer(broker)
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        out: list[ConsumerRecord] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(out) < count and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=500, max_records=2000).values():
                out.extend(msgs)
        assert len(out) >= count, f"consumed {len(out)} of {count} within {TIMEOUT_S}s"
        for msgs in consumer.poll(timeout_ms=300).values():
            out.extend(msgs)
        return out
    finally:
        consumer.close()


def to_consumed(m: ConsumerRecord) -> Consumed:
    return Consumed(
        partition=m.partition,
        offset=m.offset,
        key=m.key,
        value=m.value,
        headers=tuple(m.headers),
        timestamp_ms=m.timestamp,
    )


# ---------------------------------------------------------------------------------------------
# produce / consume round trip


@pytest.mark.parametrize("codec", CODECS)
def test_roundtrip(broker: BrokerProcess, admin: KafkaAdminClient, codec: str) -> None:
    """With kafka-python's default producer config, which is idempotent (as the Java client's
    since Kafka 3.0): the broker must answer InitProducerId and accept sequenced batches."""
    require_codec(codec)
    topic = f"rt-{codec}"
    create_topic(admin, topic)
    records = expected_records(N, PARTITIONS, tag=codec)

    check_metadata(records, produce(broker, topic, records, codec))

    messages = consume(broker, topic, range(PARTITIONS), N)
    assert {m.topic for m in messages} == {topic}
    types = {m.timestamp_type for m in messages}
    assert types == {CREATE_TIME}, f"timestamp types {types}"
    check_consumed(records, [to_consumed(m) for m in messages])


def test_log_append_time(broker: BrokerProcess, admin: KafkaAdminClient) -> None:
    topic = "lat"
    create_topic(admin, topic, configs={"message.timestamp.type": "LogAppendTime"})
    records = expected_records(300, PARTITIONS, tag="lat")
    before_ms = int(time.time() * 1000)
    metas = produce(broker, topic, records, "gzip", enable_idempotence=False)
    after_ms = int(time.time() * 1000)
    check_metadata(records, metas)
    for m in metas:
        assert before_ms - 1000 <= m.timestamp <= after_ms + 1000, m

    messages = consume(broker, topic, range(PARTITIONS), len(records))
    assert len(messages) == len(records)
    for msg in messages:
        assert msg.timestamp_type == LOG_APPEND_TIME, msg
        assert before_ms - 1000 <= msg.timestamp <= after_ms + 1000, msg


# ---------------------------------------------------------------------------------------------
# ListOffsets


def test_offsets_for_times(broker: BrokerProcess, admin: KafkaAdminClient) -> None:
    topic = "lo"
    create_topic(admin, topic)
    n = 300
    records = expected_records(n, PARTITIONS, tag="lo")
    check_metadata(records, produce(broker, topic, records, "none", enable_idempotence=False))

    consumer = new_consumer(broker)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        assert consumer.end_offsets(tps) == dict.fromkeys(tps, n // PARTITIONS)
        for t in (0, 1, 2, 3, 4, 100, 151, 298, 299, 300, 5000):
            got = consumer.offsets_for_times(dict.fromkeys(tps, BASE_TS_MS + t))
            for tp in tps:
                i = t + (tp.partition - t) % PARTITIONS  # first record i >= t in partition
                if i < n:
                    assert got[tp] is not None, (t, tp)
                    assert (got[tp].offset, got[tp].timestamp) == (
                        i // PARTITIONS,
                        BASE_TS_MS + i,
                    ), (t, tp)
                else:
                    assert got[tp] is None, (t, tp, got[tp])
    finally:
        consumer.close()


# ---------------------------------------------------------------------------------------------
# admin


def test_admin_lifecycle(admin: KafkaAdminClient) -> None:
    configs = {
        "retention.ms": "3600000",
        "cleanup.policy": "delete",
        "message.timestamp.type": "LogAppendTime",
    }
    create_topic(admin, "adm", partitions=2, configs=configs)
    assert "adm" in admin.list_topics()

    described = topic_configs(admin, "adm")
    for key, value in configs.items():
        assert key in described, f"{key} missing: {sorted(described)}"
        assert described[key]["value"] == value, described[key]
    # kafka-python's default filter keeps only non-default (modified) configs: exactly ours
    modified = topic_configs(admin, "adm", config_filter="modified")
    assert {k: v["value"] for k, v in modified.items()} == configs, modified

    # alter: kafka-python uses IncrementalAlterConfigs when the broker offers it
    result = admin.alter_configs(
        [ConfigResource(ConfigResourceType.TOPIC, "adm", configs={"retention.ms": "7200000"})]
    )
    assert result == {"topic": {"adm": "OK"}}, result
    modified = topic_configs(admin, "adm", config_filter="modified")
    assert {k: v["value"] for k, v in modified.items()} == {**configs, "retention.ms": "7200000"}

    # an unknown key is refused by the broker (raise_on_unknown=False: no client-side check)
    result = admin.alter_configs(
        [ConfigResource(ConfigResourceType.TOPIC, "adm", configs={"no.such.key": "1"})],
        raise_on_unknown=False,
    )
    assert "InvalidConfigurationError" in result["topic"]["adm"], result
    modified = topic_configs(admin, "adm", config_filter="modified")
    assert "no.such.key" not in modified

    admin.create_partitions({"adm": 4})
    (t,) = admin.describe_topics(["adm"])
    assert sorted(p["partition_index"] for p in t["partitions"]) == [0, 1, 2, 3], t

    admin.delete_topics(["adm"])
    deadline = time.monotonic() + TIMEOUT_S
    while "adm" in admin.list_topics():
        assert time.monotonic() < deadline, "adm still listed after delete"
        time.sleep(0.1)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["adm"])


def test_admin_errors(admin: KafkaAdminClient) -> None:
    create_topic(admin, "dup")
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics({"dup": {"num_partitions": 1, "replication_factor": 1}})
    for bad in ("bad/name", "a" * 300):
        with pytest.raises(InvalidTopicError):
            admin.create_topics({bad: {"num_partitions": 1, "replication_factor": 1}})
    with pytest.raises(InvalidConfigurationError):
        admin.create_topics(
            {"cfg-bad": {"num_partitions": 1, "replication_factor": 1,
                         "configs": {"no.such.key": "1"}}}
        )  # fmt: skip
    listed = set(admin.list_topics())
    assert "dup" in listed
    assert not {"bad/name", "a" * 300, "cfg-bad"} & listed, listed


# ---------------------------------------------------------------------------------------------
# raw Produce requests: what the broker itself answers for a partition / topic that does not
# exist (the clients refuse such a send locally, from their metadata, before asking the broker)


def _roundtrip(sock: socket.socket, request: Any, response_class: Any, version: int) -> Any:
    request.with_header(correlation_id=7, client_id="floe-it-raw")
    sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))

    def read(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "broker closed the connection"
            buf += chunk
        return buf

    (size,) = struct.unpack(">i", read(4))
    response = response_class.decode(read(size), version=version, header=True)
    assert response.header.correlation_id == 7
    return response


def test_raw_produce_to_missing_partition_and_topic(
    broker: BrokerProcess, admin: KafkaAdminClient
) -> None:
    create_topic(admin, "few")
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=BASE_TS_MS, key=b"k", value=b"v", headers=[])
    builder.close()
    batch = bytes(builder.buffer())

    host, port = broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        versions = _roundtrip(sock, ApiVersionsRequest(), ApiVersionsResponse, 0)
        assert versions.error_code == 0, versions
        produce_range = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}[
            ProduceRequest.API_KEY
        ]
        version = min(produce_range[1], 9)
        assert version >= max(produce_range[0], 3), produce_range

        topic_data = ProduceRequest.TopicProduceData
        part_data = topic_data.PartitionProduceData
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=5000,
            topic_data=[
                topic_data(name="few", partition_data=[part_data(index=7, records=batch)]),
                topic_data(name="nope", partition_data=[part_data(index=0, records=batch)]),
            ],
        )
        response = _roundtrip(sock, request, ProduceResponse, version)
        got = {
            (t.name, p.index): p.error_code
            for t in response.responses
            for p in t.partition_responses
        }
        assert got == {
            ("few", 7): UNKNOWN_TOPIC_OR_PARTITION,
            ("nope", 0): UNKNOWN_TOPIC_OR_PARTITION,
        }, response

    consumer = new_consumer(broker)
    try:
        tps = [TopicPartition("few", p) for p in range(PARTITIONS)]
        assert consumer.end_offsets(tps) == dict.fromkeys(tps, 0)
    finally:
        consumer.close()
    assert "nope" not in admin.list_topics()
    (t,) = admin.describe_topics(["few"])
    assert len(t["partitions"]) == PARTITIONS
