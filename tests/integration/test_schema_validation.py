"""Schema validation at produce (`confluent.value.schema.validation`,
`confluent.key.schema.validation`) against a real broker process with its registry.

Confluent's SchemaRegistryClient + AvroSerializer produce records that pass and are consumed
back; raw bytes without the magic byte, an unknown schema id, an id registered only under
another subject and an id whose only version is soft-deleted are refused with INVALID_RECORD
(the producer's delivery error), and a raw Produce shows nothing of the batch was stored (high
watermark unchanged) and which record failed (record_errors). With validation off anything
goes; with the registry off, produces to a validating topic fail with a clear message.
"""

from __future__ import annotations

import json
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.brokerproc import BrokerProcess
from tests.integration.test_bad_input import create_topic, fetch, produce
from tests.integration.test_schema_registry import registry_address
from tests.rawclient import RawClient, make_batch

with warnings.catch_warnings():  # authlib (imported by the client) warns about httpx
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

pytestmark = pytest.mark.integration

INVALID_RECORD = 87
INVALID_CONFIG = 40
USER = {"type": "record", "name": "User", "namespace": "floe.test",
        "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
ORDER = {"type": "record", "name": "Order", "namespace": "floe.test",
         "fields": [{"name": "id", "type": "long"}]}
VALIDATE_VALUES = {"confluent.value.schema.validation": "true"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        data_dir=tmp_path_factory.mktemp("sv") / "data", registry_listen="127.0.0.1:0"
    ).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def registry(broker: BrokerProcess) -> Iterator[SchemaRegistryClient]:
    c = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    try:
        yield c
    finally:
        c.close()


def wire(schema_id: int, payload: bytes = b"\x02a\x04") -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + payload


def send(broker: BrokerProcess, topic: str, value: bytes | None, key: bytes | None = None
         ) -> int:
    """Produce one record with confluent-kafka; its delivery error code (0: stored)."""
    codes: list[int] = []

    def report(err: KafkaError | None, _msg: Any) -> None:
        codes.append(0 if err is None else err.code())

    p = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0,
                  "enable.idempotence": False})
    p.produce(topic, value=value, key=key, on_delivery=report)
    assert p.flush(15) == 0
    return codes[0]


def end_offset(broker: BrokerProcess, topic: str) -> int:
    with RawClient(broker.bootstrap) as c:
        return int(fetch(c, topic, 0).high_watermark)  # type: ignore[attr-defined]


def new_topic(broker: BrokerProcess, name: str, configs: dict[str, str]) -> None:
    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, name, configs=configs).error_code == 0  # type: ignore[attr-defined]


def test_serialized_records_pass_and_are_consumed_back(
    broker: BrokerProcess, registry: SchemaRegistryClient
) -> None:
    new_topic(broker, "users", VALIDATE_VALUES)
    ser = AvroSerializer(registry, json.dumps(USER))
    ctx = SerializationContext("users", MessageField.VALUE)
    for i in range(3):
        assert send(broker, "users", ser({"name": f"u{i}", "age": i}, ctx)) == 0
    assert send(broker, "users", None, key=b"gone") == 0  # a tombstone passes
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "sv",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["users"])
    des = AvroDeserializer(registry)
    got: list[Any] = []
    try:
        while len(got) < 4:
            m = consumer.poll(10)
            assert m is not None and m.error() is None
            got.append(None if m.value() is None else des(m.value(), ctx))
    finally:
        consumer.close()
    assert got == [{"name": "u0", "age": 0}, {"name": "u1", "age": 1},
                   {"name": "u2", "age": 2}, None]


def test_bad_records_are_invalid_record_and_nothing_is_stored(
    broker: BrokerProcess, registry: SchemaRegistryClient
) -> None:
    new_topic(broker, "checked", VALIDATE_VALUES)
    good = registry.register_schema("checked-value", Schema(json.dumps(USER), "AVRO"))
    other = registry.register_schema("elsewhere-value", Schema(json.dumps(ORDER), "AVRO"))
    assert send(broker, "checked", wire(good)) == 0
    assert end_offset(broker, "checked") == 1
    for bad in [b"no magic byte here", b"\x00\x00", b"\x01" + wire(good)[1:],
                wire(good + other + 1000), wire(other)]:
        assert send(broker, "checked", bad) == INVALID_RECORD, bad
    assert end_offset(broker, "checked") == 1
    # a batch whose second record is bad: the whole batch refused, record_errors names it
    with RawClient(broker.bootstrap) as c:
        r: Any = produce(c, "checked", {0: make_batch([wire(good), wire(other), wire(good)])})[0]
    assert r.error_code == INVALID_RECORD
    assert [e.batch_index for e in r.record_errors] == [1]
    assert "not registered under subject 'checked-value'" in r.error_message
    assert r.record_errors[0].batch_index_error_message == r.error_message
    with RawClient(broker.bootstrap) as c:
        r = produce(c, "checked", {0: make_batch([wire(good), wire(good + other + 1000)])})[0]
    assert r.error_code == INVALID_RECORD and "unknown schema id" in r.error_message
    assert end_offset(broker, "checked") == 1


def test_soft_deleted_version_does_not_validate(
    broker: BrokerProcess, registry: SchemaRegistryClient
) -> None:
    new_topic(broker, "retired", VALIDATE_VALUES)
    sid = registry.register_schema("retired-value", Schema(json.dumps(ORDER), "AVRO"))
    registry.delete_subject("retired-value")  # soft
    assert send(broker, "retired", wire(sid)) == INVALID_RECORD
    assert end_offset(broker, "retired") == 0


def test_key_validation(broker: BrokerProcess, registry: SchemaRegistryClient) -> None:
    new_topic(broker, "keyed", {"confluent.key.schema.validation": "true"})
    kid = registry.register_schema("keyed-key", Schema(json.dumps(ORDER), "AVRO"))
    vid = registry.register_schema("keyed-value", Schema(json.dumps(USER), "AVRO"))
    assert send(broker, "keyed", b"any value", key=wire(kid)) == 0
    assert send(broker, "keyed", b"any value", key=wire(vid)) == INVALID_RECORD
    assert send(broker, "keyed", b"any value", key=b"raw key") == INVALID_RECORD
    assert send(broker, "keyed", b"any value", key=None) == INVALID_RECORD
    assert end_offset(broker, "keyed") == 1


def test_validation_off_accepts_anything_and_other_strategies_are_refused(
    broker: BrokerProcess,
) -> None:
    new_topic(broker, "free", {})
    for v in [b"no magic", wire(999_999), None]:
        assert send(broker, "free", v, key=b"k") == 0
    assert end_offset(broker, "free") == 3
    with RawClient(broker.bootstrap) as c:
        bad: Any = create_topic(c, "strategic", configs={
            "confluent.value.subject.name.strategy":
                "io.confluent.kafka.serializers.subject.RecordNameStrategy"})
        assert bad.error_code == INVALID_CONFIG
        ok: Any = create_topic(c, "strategic", configs={
            "confluent.value.subject.name.strategy":
                "io.confluent.kafka.serializers.subject.TopicNameStrategy"})
        assert ok.error_code == 0


def test_registry_off_fails_every_produce_to_a_validating_topic(tmp_path: Path) -> None:
    b = BrokerProcess(data_dir=tmp_path / "data", registry_listen="").start()
    try:
        new_topic(b, "orphan", VALIDATE_VALUES)  # accepted: configs outlive a broker start
        with RawClient(b.bootstrap) as c:
            r: Any = produce(c, "orphan", {0: make_batch([wire(1)])})[0]
        assert r.error_code == INVALID_RECORD
        assert r.error_message == "schema validation is on but no registry"
        assert end_offset(b, "orphan") == 0
        new_topic(b, "plain", {})
        assert send(b, "plain", b"anything") == 0
    finally:
        b.stop()
