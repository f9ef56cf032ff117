"""An external Schema Registry (`--schema-registry-url`): broker A serves its built-in registry
(a real Confluent-API server, standing in for an external one); broker B, on its own data dir
with its own registry off, reads A's. confluent-kafka's SchemaRegistryClient registers an Avro
schema in A and AvroSerializer records go to a table topic on B with by_schema_id and
confluent.value.schema.validation=true: typed columns, every record exactly once; an id unknown
to A is INVALID_RECORD at produce. A stopped: B's /status shows the registry unreachable with
the error, and a validated produce fails with the retriable KAFKA_STORAGE_ERROR, nothing stored.
Records of a topic without validation produced meanwhile, with a schema id B has not read
yet, are not dead-lettered: their rows appear once A is back. A restarted on the same port:
produce and conversion work again."""

from __future__ import annotations

import json
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.types import DoubleType, LongType, StringType

from tests.brokerproc import BrokerProcess
from tests.integration.test_schema_registry import registry_address
from tests.integration.test_schema_validation import end_offset, send, wire
from tests.integration.test_table_topic import catalog, create_table_topic, keys_of, table_rows

with warnings.catch_warnings():  # authlib (imported by the client) warns about httpx
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

pytestmark = pytest.mark.integration

INVALID_RECORD = 87
KAFKA_STORAGE_ERROR = 56
TOPIC = "orders"
ORDER = {"type": "record", "name": "Order", "namespace": "floe.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
    {"name": "price", "type": "double"}]}
LOOSE = "refunds.loose"
REFUND = {"type": "record", "name": "Refund", "namespace": "floe.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "reason", "type": "string"}]}


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    a = BrokerProcess(data_dir=tmp_path / "a", registry_listen="127.0.0.1:0").start()
    b = None
    try:
        url = f"http://{registry_address(a)}"
        b = BrokerProcess(data_dir=tmp_path / "b", registry_listen=None,
                          extra_args=["--schema-registry-url", url]).start()
        yield a, b
    finally:
        if b is not None:
            b.stop()
        a.stop()


def registry_health(b: BrokerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{b.admin_address()}/status", timeout=10) as r:
        component: dict[str, Any] = json.loads(r.read())["health"]["components"][
            "schema_registry"]
    return component


def wait_health(b: BrokerProcess, ok: bool, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        h = registry_health(b)
        if h["ok"] == ok and h["checked_at"] > 0:
            return h
        if time.monotonic() > deadline:
            raise AssertionError(f"registry health stayed {h}")
        time.sleep(0.5)


def produce(b: BrokerProcess, values: list[bytes], topic: str = TOPIC
            ) -> set[tuple[int, int]]:
    acked: set[tuple[int, int]] = set()

    def done(err: Any, m: Any) -> None:
        assert err is None, err
        acked.add((m.partition(), m.offset()))

    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    for v in values:
        p.produce(topic, v, on_delivery=done)
        p.poll(0)
    assert p.flush(30) == 0
    assert len(acked) == len(values)
    return acked


def wait_rows(data: Path, keys: set[tuple[int, int]], topic: str = TOPIC,
              timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = table_rows(data, topic.replace('.', '_'))
        if keys <= set(keys_of(rows)):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"table has {len(rows)} rows, want {len(keys)} keys")


def order(i: int) -> dict[str, Any]:
    return {"id": i, "item": f"item-{i}", "price": i / 4}


def test_broker_reads_an_external_registry(
    brokers: tuple[BrokerProcess, BrokerProcess], tmp_path: Path
) -> None:
    a, b = brokers
    assert not b.registry, "B serves no registry of its own"
    assert wait_health(b, True)["target"] == f"http://{registry_address(a)}"
    create_table_topic(b.bootstrap, TOPIC, 1, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.commit.interval.ms": "500",
        "confluent.value.schema.validation": "true"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(a)}"})
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    ser = AvroSerializer(sr, json.dumps(ORDER))  # registers ORDER in A on first use
    acked = produce(b, [ser(order(i), ctx) for i in range(50)])
    sid = int.from_bytes(ser(order(0), ctx)[1:5], "big")
    assert sr.get_latest_version(f"{TOPIC}-value").schema_id == sid
    # a second schema B has not read yet, for a topic without validation (see below)
    create_table_topic(b.bootstrap, LOOSE, 1, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.commit.interval.ms": "500"})
    refunds = [AvroSerializer(sr, json.dumps(REFUND))(
        {"id": i, "reason": f"r{i}"}, SerializationContext(LOOSE, MessageField.VALUE))
        for i in range(20)]
    sr.close()

    # an id A does not hold is refused at produce, nothing stored
    before = end_offset(b, TOPIC)
    assert send(b, TOPIC, wire(sid + 1000)) == INVALID_RECORD
    assert end_offset(b, TOPIC) == before

    rows = wait_rows(tmp_path / "b", acked)
    assert set(keys_of(rows)) == acked and max(keys_of(rows).values()) == 1, "exactly once"
    schema = catalog(tmp_path / "b").load_table(("default", TOPIC)).schema()
    assert schema.find_field("id").field_type == LongType()
    assert schema.find_field("item").field_type == StringType()
    assert schema.find_field("price").field_type == DoubleType()
    assert sorted(r["id"] for r in rows) == list(range(50))

    # A down: /status says so with the error; validated produces fail retriably
    registry_at = registry_address(a)
    a.stop()
    h = wait_health(b, False)
    assert h["last_error"] and h["last_error_at"] > 0, h
    time.sleep(5.5)  # past the validator's 5 s cache of the subject's ids
    before = end_offset(b, TOPIC)
    value = ser(order(50), SerializationContext(TOPIC, MessageField.VALUE))
    assert send(b, TOPIC, value) == KAFKA_STORAGE_ERROR
    assert end_offset(b, TOPIC) == before, "nothing stored unvalidated"
    # without validation records are stored; their table rows wait for the registry (the
    # writer retries: no dead letter, no silent drop)
    loose = produce(b, refunds, LOOSE)
    time.sleep(3)
    assert not table_rows(tmp_path / "b", "refunds_loose")

    # A back on the same port: produce and conversion work again
    a.registry_listen = registry_at
    a.registry = ""
    a.start()
    assert registry_address(a) == registry_at
    acked |= produce(b, [ser(order(i), ctx) for i in range(50, 80)])
    rows = wait_rows(tmp_path / "b", acked)
    assert set(keys_of(rows)) == acked and max(keys_of(rows).values()) == 1
    wait_health(b, True)
    rows = wait_rows(tmp_path / "b", loose, LOOSE)
    assert set(keys_of(rows)) == loose and max(keys_of(rows).values()) == 1
    assert sorted((r["id"], r["reason"]) for r in rows) == [(i, f"r{i}") for i in range(20)]
