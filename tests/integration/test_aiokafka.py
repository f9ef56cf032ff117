"""aiokafka against a real floe broker process.

aiokafka compresses snappy / lz4 / zstd through `cramjam` (a floe dependency), gzip through the
standard library.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka import codec as aiokafka_codec
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import RecordMetadata

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

# Kafka error codes
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_CONFIG = 40
# DescribeConfigs config_source (v1+)
DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5

CREATE_TIME = 0
LOG_APPEND_TIME = 1

CODEC_AVAILABLE = {
    "none": True,
    "gzip": aiokafka_codec.has_gzip(),
    "snappy": aiokafka_codec.has_snappy(),
    "lz4": aiokafka_codec.has_lz4(),
    "zstd": aiokafka_codec.has_zstd(),
}


# ---------------------------------------------------------------------------------------------
# helpers


async def new_admin(broker: BrokerProcess) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    return admin


def topic_errors(resp: Any) -> dict[str, int]:
    """CreateTopics / DeleteTopics response -> {topic: error_code}."""
    obj = resp.to_object()
    rows = obj.get("topic_errors", obj.get("topic_error_codes"))
    assert rows is not None, obj
    return {r["topic"]: r["error_code"] for r in rows}


async def create_topic(
    admin: AIOKafkaAdminClient,
    name: str,
    partitions: int = PARTITIONS,
    configs: dict[str, str] | None = None,
) -> None:
    resp = await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
    assert topic_errors(resp) == {name: NONE}, resp
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        (t,) = await admin.describe_topics([name])
        if t["error_code"] == NONE and len(t["partitions"]) == partitions:
            return
        assert time.monotonic() < deadline, f"{name} not in metadata: {t}"
        await asyncio.sleep(0.1)


async def describe_topic(admin: AIOKafkaAdminClient, name: str) -> dict[str, Any]:
    """DescribeConfigs for one topic -> the resource object (error_code, config_entries, ...)."""
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    resources = [r for resp in responses for r in resp.to_object()["resources"]]
    assert len(resources) == 1, resources
    (res,) = resources
    assert res["resource_name"] == name, res
    return res


def entries(resource: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert resource["error_code"] == NONE, resource
    # aiokafka's schema calls the name field "config_names"
    return {e["config_names"]: e for e in resource["config_entries"]}


async def produce(
    broker: BrokerProcess, topic: str, records: list[Rec], codec: str
) -> list[RecordMetadata]:
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
    )
    await producer.start()
    try:
        async with asyncio.timeout(TIMEOUT_S):
            futures = [
                await producer.send(
                    topic,
                    value=r.value,
                    key=r.key,
                    partition=r.partition,
                    timestamp_ms=r.timestamp_ms,
                    headers=list(r.headers),
                )
                for r in records
            ]
            return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


def check_metadata(records: list[Rec], metas: list[RecordMetadata]) -> None:
    per_partition: dict[int, list[int]] = defaultdict(list)
    for r, m in zip(records, metas, strict=True):
        assert m.partition == r.partition
        per_partition[m.partition].append(m.offset)
    for p, offsets in per_partition.items():
        assert offsets == list(range(len(offsets))), f"p{p} offsets not dense from 0"


async def consume(
    broker: BrokerProcess, topic: str, partitions: range, count: int
) -> list[ConsumerRecord[bytes, bytes]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        out: list[ConsumerRecord[bytes, bytes]] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(out) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            for msgs in batches.values():
                out.extend(msgs)
        assert len(out) >= count, f"consumed {len(out)} of {count} within {TIMEOUT_S}s"
        # nothing more may follow
        for msgs in (await consumer.getmany(timeout_ms=300)).values():
            out.extend(msgs)
        return out
    finally:
        await consumer.stop()


def to_consumed(m: ConsumerRecord[bytes, bytes]) -> Consumed:
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
async def test_roundtrip(broker: BrokerProcess, codec: str) -> None:
    assert CODEC_AVAILABLE[codec], f"aiokafka cannot use {codec}: is cramjam installed?"
    topic = f"rt-{codec}"
    admin = await new_admin(broker)
    try:
        await create_topic(admin, topic)
    finally:
        await admin.close()
    records = expected_records(N, PARTITIONS, tag=codec)

    metas = await produce(broker, topic, records, codec)
    check_metadata(records, metas)

    messages = await consume(broker, topic, range(PARTITIONS), N)
    assert {m.topic for m in messages} == {topic}
    types = {m.timestamp_type for m in messages}
    assert types == {CREATE_TIME}, f"timestamp types {types}"
    check_consumed(records, [to_consumed(m) for m in messages])


async def test_log_append_time(broker: BrokerProcess) -> None:
    topic = "lat"
    admin = await new_admin(broker)
    try:
        await create_topic(admin, topic, configs={"message.timestamp.type": "LogAppendTime"})
    finally:
        await admin.close()
    records = expected_records(300, PARTITIONS, tag="lat")
    before_ms = int(time.time() * 1000)
    metas = await produce(broker, topic, records, "gzip")
    after_ms = int(time.time() * 1000)
    check_metadata(records, metas)
    for m in metas:
        # the produce response carries the append time (log_append_time_ms)
        assert m.timestamp_type == LOG_APPEND_TIME, m
        assert m.timestamp is not None and before_ms - 1000 <= m.timestamp <= after_ms + 1000, m

    messages = await consume(broker, topic, range(PARTITIONS), len(records))
    for msg in messages:
        assert msg.timestamp_type == LOG_APPEND_TIME, msg
        assert before_ms - 1000 <= msg.timestamp <= after_ms + 1000, msg
    assert len(messages) == len(records)


async def test_offsets_lookup(broker: BrokerProcess) -> None:
    topic = "lo"
    admin = await new_admin(broker)
    try:
        await create_topic(admin, topic)
    finally:
        await admin.close()
    n = 300
    records = expected_records(n, PARTITIONS, tag="lo")
    check_metadata(records, await produce(broker, topic, records, "none"))

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert await consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        assert await consumer.end_offsets(tps) == dict.fromkeys(tps, n // PARTITIONS)
        for t in (0, 1, 2, 3, 151, 299, 300):
            got = await consumer.offsets_for_times(dict.fromkeys(tps, BASE_TS_MS + t))
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
        await consumer.stop()


# ---------------------------------------------------------------------------------------------
# admin


async def test_admin_create_describe_delete(broker: BrokerProcess) -> None:
    admin = await new_admin(broker)
    try:
        configs = {
            "retention.ms": "3600000",
            "cleanup.policy": "delete",
            "message.timestamp.type": "LogAppendTime",
        }
        await create_topic(admin, "adm", partitions=2, configs=configs)
        assert "adm" in await admin.list_topics()

        described = entries(await describe_topic(admin, "adm"))
        for key, value in configs.items():
            assert key in described, f"{key} missing: {sorted(described)}"
            assert described[key]["config_value"] == value, described[key]
            if "config_source" in described[key]:
                assert described[key]["config_source"] == DYNAMIC_TOPIC_CONFIG, described[key]
            else:
                assert described[key]["is_default"] is False, described[key]

        # creating it again
        resp = await admin.create_topics([NewTopic("adm", 1, 1)])
        assert topic_errors(resp) == {"adm": TOPIC_ALREADY_EXISTS}, resp

        # invalid names and unknown configs
        resp = await admin.create_topics(
            [
                NewTopic("bad/name", 1, 1),
                NewTopic("a" * 300, 1, 1),
                NewTopic("cfg-bad", 1, 1, topic_configs={"no.such.key": "1"}),
            ]
        )
        assert topic_errors(resp) == {
            "bad/name": INVALID_TOPIC_EXCEPTION,
            "a" * 300: INVALID_TOPIC_EXCEPTION,
            "cfg-bad": INVALID_CONFIG,
        }, resp
        listed = await admin.list_topics()
        assert not {"bad/name", "a" * 300, "cfg-bad"} & set(listed), listed

        # more partitions
        await admin.create_partitions({"adm": NewPartitions(4)})
        (t,) = await admin.describe_topics(["adm"])
        assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2, 3], t

        # delete
        resp = await admin.delete_topics(["adm"])
        assert topic_errors(resp) == {"adm": NONE}, resp
        deadline = time.monotonic() + TIMEOUT_S
        while "adm" in await admin.list_topics():
            assert time.monotonic() < deadline, "adm still listed after delete"
            await asyncio.sleep(0.1)
        resp = await admin.delete_topics(["adm"])
        assert topic_errors(resp) == {"adm": UNKNOWN_TOPIC_OR_PARTITION}, resp

        res = await describe_topic(admin, "adm")
        assert res["error_code"] == UNKNOWN_TOPIC_OR_PARTITION, res
    finally:
        await admin.close()


async def test_admin_alter_configs(broker: BrokerProcess) -> None:
    """AlterConfigs (the non-incremental API, key 33) replaces the topic's whole override set."""
    admin = await new_admin(broker)
    try:
        await create_topic(
            admin,
            "alt",
            configs={"retention.ms": "3600000", "message.timestamp.type": "LogAppendTime"},
        )
        responses = await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, "alt", configs={"retention.ms": "7200000"})]
        )
        results = [r for resp in responses for r in resp.to_object()["resources"]]
        assert [(r["resource_name"], r["error_code"]) for r in results] == [("alt", NONE)], results

        described = entries(await describe_topic(admin, "alt"))
        assert described["retention.ms"]["config_value"] == "7200000"
        # not named in AlterConfigs: back to the default
        ts_type = described.get("message.timestamp.type")
        assert ts_type is None or ts_type["config_value"] == "CreateTime", ts_type
        if ts_type is not None and "config_source" in ts_type:
            assert ts_type["config_source"] == DEFAULT_CONFIG, ts_type
    finally:
        await admin.close()
