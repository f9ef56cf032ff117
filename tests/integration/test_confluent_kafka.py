"""librdkafka (confluent-kafka) against a real floe broker process.

Every test gets a fresh single-node broker (the `broker` fixture). The consumers only use
`assign()`: consumer groups are not exercised here, but librdkafka still wants a group.id.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterable

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from tests.brokerproc import BrokerProcess
from tests.integration.workload import (
    BASE_TS_MS,
    CODECS,
    Consumed,
    Rec,
    check_consumed,
    expected_records,
)

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 3
TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------------------------
# helpers


def admin_client(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def error_of(exc: BaseException) -> KafkaError:
    assert isinstance(exc, KafkaException), repr(exc)
    err = exc.args[0]
    assert isinstance(err, KafkaError), repr(exc)
    return err


def create_topic(
    admin: AdminClient,
    name: str,
    partitions: int = PARTITIONS,
    config: dict[str, str] | None = None,
) -> None:
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        request_timeout=TIMEOUT_S,
    )
    futures[name].result(timeout=TIMEOUT_S)
    wait_for_partitions(admin, name, partitions)


def create_topic_error(admin: AdminClient, topic: NewTopic) -> KafkaError:
    futures = admin.create_topics([topic], request_timeout=TIMEOUT_S)
    with pytest.raises(KafkaException) as info:
        futures[topic.topic].result(timeout=TIMEOUT_S)
    return error_of(info.value)


def wait_for_partitions(admin: AdminClient, name: str, partitions: int) -> None:
    """Until metadata shows the topic with `partitions` partitions, each with a leader."""
    deadline = time.monotonic() + TIMEOUT_S
    last = None
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=TIMEOUT_S)
        t = md.topics.get(name)
        last = t
        if (
            t is not None
            and t.error is None
            and sorted(t.partitions) == list(range(partitions))
            and all(p.leader >= 0 for p in t.partitions.values())
        ):
            return
        time.sleep(0.1)
    pytest.fail(f"topic {name} never showed {partitions} partitions with leaders: {last!r}")


def describe_topic_configs(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, name)], request_timeout=TIMEOUT_S
    )
    (future,) = futures.values()
    result: dict[str, ConfigEntry] = future.result(timeout=TIMEOUT_S)
    return result


def produce(
    broker: BrokerProcess,
    topic: str,
    records: list[Rec],
    codec: str = "none",
    **extra: object,
) -> list[tuple[KafkaError | None, int, int]]:
    """Produce every record to its own partition; returns (error, partition, offset) per record,
    in the order the records were given."""
    reports: list[tuple[KafkaError | None, int, int] | None] = [None] * len(records)

    def on_delivery(i: int, err: KafkaError | None, msg: Message) -> None:
        reports[i] = (err, msg.partition(), msg.offset())

    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 5,
            **extra,
        }
    )
    deadline = time.monotonic() + TIMEOUT_S
    for i, r in enumerate(records):
        while True:
            try:
                producer.produce(
                    topic,
                    value=r.value,
                    key=r.key,
                    partition=r.partition,
                    timestamp=r.timestamp_ms,
                    headers=list(r.headers),
                    on_delivery=lambda err, msg, i=i: on_delivery(i, err, msg),
                )
                break
            except BufferError:
                assert time.monotonic() < deadline, "producer queue never drained"
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(TIMEOUT_S)
    assert remaining == 0, f"{remaining} records not delivered within {TIMEOUT_S}s"
    missing = [i for i, rep in enumerate(reports) if rep is None]
    assert not missing, f"no delivery report for {len(missing)} records"
    return [rep for rep in reports if rep is not None]


def check_delivery_reports(
    records: list[Rec], reports: list[tuple[KafkaError | None, int, int]]
) -> None:
    """No errors; each partition's offsets are 0, 1, 2, ... in produce order."""
    errors = [(i, err) for i, (err, _, _) in enumerate(reports) if err is not None]
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:3]}"
    per_partition: dict[int, list[int]] = defaultdict(list)
    for r, (_, partition, offset) in zip(records, reports, strict=True):
        assert partition == r.partition
        per_partition[partition].append(offset)
    for p, offsets in per_partition.items():
        assert offsets == list(range(len(offsets))), f"p{p} offsets not dense from 0"


def new_consumer(broker: BrokerProcess, **extra: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"floe-it-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "check.crcs": True,
            **extra,
        }
    )


def consume_all(
    broker: BrokerProcess, topic: str, partitions: Iterable[int], count: int
) -> list[Message]:
    """Assign the partitions at OFFSET_BEGINNING and read `count` messages (then make sure no
    extra message follows)."""
    consumer = new_consumer(broker)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: list[Message] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                err = m.error()
                assert err is None, f"consumer error: {err!r}"
                out.append(m)
        assert len(out) >= count, f"consumed {len(out)} of {count} within {TIMEOUT_S}s"
        for m in consumer.consume(num_messages=1000, timeout=0.3):
            assert m.error() is None, f"consumer error: {m.error()!r}"
            out.append(m)
        return out
    finally:
        consumer.close()


def to_consumed(m: Message) -> Consumed:
    _, ts = m.timestamp()
    return Consumed(
        partition=m.partition(),
        offset=m.offset(),
        key=m.key(),
        value=m.value(),
        headers=tuple(m.headers() or ()),
        timestamp_ms=ts,
    )


# ---------------------------------------------------------------------------------------------
# produce / consume round trip


@pytest.mark.parametrize("codec", CODECS)
def test_roundtrip(broker: BrokerProcess, codec: str) -> None:
    topic = f"rt-{codec}"
    admin = admin_client(broker)
    create_topic(admin, topic)
    records = expected_records(N, PARTITIONS, tag=codec)

    reports = produce(broker, topic, records, codec)
    check_delivery_reports(records, reports)

    messages = consume_all(broker, topic, range(PARTITIONS), N)
    assert {m.topic() for m in messages} == {topic}
    types = {m.timestamp()[0] for m in messages}
    assert types == {TIMESTAMP_CREATE_TIME}, f"timestamp types {types}"
    check_consumed(records, [to_consumed(m) for m in messages])


# ---------------------------------------------------------------------------------------------
# admin


def test_admin_topic_lifecycle(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    name = "admin-cfg"
    configs = {
        "retention.ms": "3600000",
        "cleanup.policy": "delete",
        "message.timestamp.type": "LogAppendTime",
    }
    create_topic(admin, name, partitions=2, config=configs)

    described = describe_topic_configs(admin, name)
    for key, value in configs.items():
        assert key in described, f"{key} missing from DescribeConfigs: {sorted(described)}"
        entry = described[key]
        assert entry.value == value, f"{key}: {entry.value!r} != {value!r}"
        assert ConfigSource(entry.source) == ConfigSource.DYNAMIC_TOPIC_CONFIG, (
            f"{key}: source {entry.source!r}, a topic override is DYNAMIC_TOPIC_CONFIG"
        )
        assert not entry.is_default, f"{key} reported as default"

    # incremental alter changes one key and leaves the others alone
    futures = admin.incremental_alter_configs(
        [
            ConfigResource(
                ResourceType.TOPIC,
                name,
                incremental_configs=[
                    ConfigEntry(
                        "retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET
                    )
                ],
            )
        ],
        request_timeout=TIMEOUT_S,
    )
    for f in futures.values():
        f.result(timeout=TIMEOUT_S)
    described = describe_topic_configs(admin, name)
    assert described["retention.ms"].value == "7200000"
    assert described["cleanup.policy"].value == "delete"
    assert described["message.timestamp.type"].value == "LogAppendTime"

    # more partitions
    futures = admin.create_partitions([NewPartitions(name, 5)], request_timeout=TIMEOUT_S)
    futures[name].result(timeout=TIMEOUT_S)
    md = admin.list_topics(topic=name, timeout=TIMEOUT_S)
    assert sorted(md.topics[name].partitions) == [0, 1, 2, 3, 4]
    broker_ids = set(md.brokers)
    for p in md.topics[name].partitions.values():
        assert p.error is None
        assert p.leader in broker_ids, f"p{p.id} leader {p.leader} not in {broker_ids}"

    # delete
    futures = admin.delete_topics([name], request_timeout=TIMEOUT_S)
    futures[name].result(timeout=TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while name in admin.list_topics(timeout=TIMEOUT_S).topics:
        assert time.monotonic() < deadline, f"{name} still listed after delete_topics"
        time.sleep(0.1)


def test_admin_list_topics_and_brokers(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    for name in ("lt-a", "lt-b"):
        create_topic(admin, name, partitions=2)
    md = admin.list_topics(timeout=TIMEOUT_S)
    assert {"lt-a", "lt-b"} <= set(md.topics)
    assert len(md.brokers) == 1
    (b,) = md.brokers.values()
    assert f"{b.host}:{b.port}" == broker.bootstrap
    assert md.controller_id == b.id
    for name in ("lt-a", "lt-b"):
        t = md.topics[name]
        assert t.error is None
        assert sorted(t.partitions) == [0, 1]
        for p in t.partitions.values():
            assert p.leader == b.id
            assert p.replicas == [b.id]
            assert p.isrs == [b.id]


def test_admin_create_existing_topic(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    create_topic(admin, "dup")
    err = create_topic_error(admin, NewTopic("dup", num_partitions=1, replication_factor=1))
    assert err.code() == KafkaError.TOPIC_ALREADY_EXISTS, err
    # the original is untouched
    md = admin.list_topics(topic="dup", timeout=TIMEOUT_S)
    assert sorted(md.topics["dup"].partitions) == list(range(PARTITIONS))


@pytest.mark.parametrize(
    "name", ["bad/name", "a" * 300, "..", "sp ace"], ids=["slash", "300-chars", "dotdot", "space"]
)
def test_admin_invalid_topic_name(broker: BrokerProcess, name: str) -> None:
    admin = admin_client(broker)
    err = create_topic_error(admin, NewTopic(name, num_partitions=1, replication_factor=1))
    assert err.code() == KafkaError.TOPIC_EXCEPTION, err  # INVALID_TOPIC_EXCEPTION (17)
    assert name not in admin.list_topics(timeout=TIMEOUT_S).topics


def test_admin_unknown_config(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    err = create_topic_error(
        admin,
        NewTopic("cfg-bad", num_partitions=1, replication_factor=1, config={"no.such.key": "1"}),
    )
    assert err.code() == KafkaError.INVALID_CONFIG, err
    assert "cfg-bad" not in admin.list_topics(timeout=TIMEOUT_S).topics

    # an unknown key in IncrementalAlterConfigs is refused too, and changes nothing
    create_topic(admin, "cfg-ok", config={"retention.ms": "1000"})
    futures = admin.incremental_alter_configs(
        [
            ConfigResource(
                ResourceType.TOPIC,
                "cfg-ok",
                incremental_configs=[
                    ConfigEntry("no.such.key", "1", incremental_operation=AlterConfigOpType.SET)
                ],
            )
        ],
        request_timeout=TIMEOUT_S,
    )
    with pytest.raises(KafkaException) as info:
        for f in futures.values():
            f.result(timeout=TIMEOUT_S)
    assert error_of(info.value).code() == KafkaError.INVALID_CONFIG, info.value
    described = describe_topic_configs(admin, "cfg-ok")
    assert "no.such.key" not in described
    assert described["retention.ms"].value == "1000"


def test_admin_unknown_topic(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    futures = admin.delete_topics(["nope"], request_timeout=TIMEOUT_S)
    with pytest.raises(KafkaException) as info:
        futures["nope"].result(timeout=TIMEOUT_S)
    assert error_of(info.value).code() == KafkaError.UNKNOWN_TOPIC_OR_PART, info.value

    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, "nope")], request_timeout=TIMEOUT_S
    )
    with pytest.raises(KafkaException) as info:
        for f in futures.values():
            f.result(timeout=TIMEOUT_S)
    assert error_of(info.value).code() == KafkaError.UNKNOWN_TOPIC_OR_PART, info.value


# ---------------------------------------------------------------------------------------------
# ListOffsets


def test_offsets_for_times_and_watermarks(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    topic = "lo"
    create_topic(admin, topic)
    n = 300  # record i: partition i % 3, offset i // 3, timestamp BASE_TS_MS + i
    records = expected_records(n, PARTITIONS, tag="lo")
    check_delivery_reports(records, produce(broker, topic, records, "none", **{"linger.ms": 0}))
    per_partition = n // PARTITIONS

    consumer = new_consumer(broker)
    try:
        for p in range(PARTITIONS):
            wm = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=TIMEOUT_S, cached=False
            )
            assert wm == (0, per_partition), f"p{p} watermarks {wm}"

        def expected_offset(p: int, t: int) -> int:
            # first i >= t with i % 3 == p, as an offset; -1 (OFFSET_END) when there is none
            t = max(t, 0)
            i = t + (p - t) % PARTITIONS
            return i // PARTITIONS if i < n else OFFSET_END

        for t in (-5, 0, 1, 2, 3, 4, 100, 151, 297, 298, 299, 300, 1000):
            query = [TopicPartition(topic, p, BASE_TS_MS + t) for p in range(PARTITIONS)]
            result = consumer.offsets_for_times(query, timeout=TIMEOUT_S)
            got = {tp.partition: tp.offset for tp in result}
            for tp in result:
                assert tp.error is None, f"t={t} p{tp.partition}: {tp.error!r}"
            want = {p: expected_offset(p, t) for p in range(PARTITIONS)}
            assert got == want, f"offsets_for_times(BASE_TS_MS + {t})"

        # the special timestamps: -2 earliest, -1 latest
        result = consumer.offsets_for_times(
            [TopicPartition(topic, p, -2) for p in range(PARTITIONS)], timeout=TIMEOUT_S
        )
        assert {tp.partition: tp.offset for tp in result} == dict.fromkeys(range(PARTITIONS), 0)
        result = consumer.offsets_for_times(
            [TopicPartition(topic, p, -1) for p in range(PARTITIONS)], timeout=TIMEOUT_S
        )
        assert {tp.partition: tp.offset for tp in result} == dict.fromkeys(
            range(PARTITIONS), per_partition
        )
    finally:
        consumer.close()


def test_watermarks_empty_topic(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    create_topic(admin, "empty")
    consumer = new_consumer(broker)
    try:
        for p in range(PARTITIONS):
            wm = consumer.get_watermark_offsets(
                TopicPartition("empty", p), timeout=TIMEOUT_S, cached=False
            )
            assert wm == (0, 0)
        result = consumer.offsets_for_times(
            [TopicPartition("empty", p, BASE_TS_MS) for p in range(PARTITIONS)],
            timeout=TIMEOUT_S,
        )
        assert {tp.partition: tp.offset for tp in result} == dict.fromkeys(
            range(PARTITIONS), OFFSET_END
        )
    finally:
        consumer.close()


# ---------------------------------------------------------------------------------------------
# LogAppendTime


@pytest.mark.parametrize("codec", CODECS)
def test_log_append_time(broker: BrokerProcess, codec: str) -> None:
    admin = admin_client(broker)
    topic = f"lat-{codec}"
    create_topic(admin, topic, config={"message.timestamp.type": "LogAppendTime"})
    n = 600
    records = expected_records(n, PARTITIONS, tag=codec)  # CreateTime values from 2023
    before_ms = int(time.time() * 1000)
    check_delivery_reports(records, produce(broker, topic, records, codec))
    after_ms = int(time.time() * 1000)

    messages = consume_all(broker, topic, range(PARTITIONS), n)
    for m in messages:
        ts_type, ts = m.timestamp()
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME, f"p{m.partition()}@{m.offset()}: {ts_type}"
        assert before_ms - 1000 <= ts <= after_ms + 1000, (
            f"p{m.partition()}@{m.offset()}: append time {ts} not in [{before_ms}, {after_ms}]"
        )
    # everything else intact
    consumed = [to_consumed(m) for m in messages]
    by_ts = {c.offset * PARTITIONS + c.partition: c.timestamp_ms for c in consumed}
    check_consumed(
        [Rec(r.partition, r.key, r.value, r.headers, by_ts[i]) for i, r in enumerate(records)],
        consumed,
    )


# ---------------------------------------------------------------------------------------------
# errors on produce


def test_produce_to_missing_partition(broker: BrokerProcess) -> None:
    admin = admin_client(broker)
    topic = "few"
    create_topic(admin, topic)
    reports: list[KafkaError | None] = []
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "message.timeout.ms": 10_000,
        }
    )
    # learn the topic's metadata first, as a long-running producer would have
    assert sorted(producer.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions) == [
        0,
        1,
        2,
    ]
    try:
        producer.produce(
            topic,
            value=b"v",
            key=b"k",
            partition=PARTITIONS + 4,
            on_delivery=lambda err, msg: reports.append(err),
        )
    except KafkaException as e:
        # librdkafka knows the partition count and may refuse the record locally
        err = error_of(e)
    else:
        assert producer.flush(TIMEOUT_S) == 0
        assert len(reports) == 1, reports
        assert reports[0] is not None, "produce to a missing partition reported success"
        err = reports[0]
    assert err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION), err

    md = admin.list_topics(topic=topic, timeout=TIMEOUT_S)
    assert sorted(md.topics[topic].partitions) == list(range(PARTITIONS))
    consumer = new_consumer(broker)
    try:
        for p in range(PARTITIONS):
            wm = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=TIMEOUT_S, cached=False
            )
            assert wm == (0, 0), f"p{p}: {wm}"
    finally:
        consumer.close()
