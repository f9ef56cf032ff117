"""Keys and value transforms through a real broker: Debezium change events (schemaless JSON, as
Debezium's JsonConverter writes them with schemas.enable=false) unwrapped by flatten_debezium
into the row's columns plus _cdc, the key as _kafka_key, the tombstone after a delete in the
DLQ; `none` keeping the whole value in _kafka_value; Avro record keys (AvroSerializer, subject
<topic>-key, convert.key.type=by_schema_id) as a _kafka_key struct next to JSON Schema
values."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.types import StructType

from tests.brokerproc import BrokerProcess
from tests.integration.test_schema_registry import registry_address
from tests.integration.test_table_topic import catalog, create_table_topic, table_rows
from tests.integration.test_table_topic_avro import broker, dead_letters  # noqa: F401
from tests.integration.test_table_topic_json_proto import JV1, jevent

with warnings.catch_warnings():  # authlib (imported by the client) warns about httpx
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

pytestmark = pytest.mark.integration


def change(op: str, before: Any, after: Any, ts: int) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op, "ts_ms": ts,
                       "source": {"db": "shop", "table": "users"}}).encode()


def wait_rows(data: Path, table: str, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(rows) < n:
        rows = table_rows(data, table)
        time.sleep(0.1)
    return rows


def test_debezium_events_and_whole_values(broker: BrokerProcess,  # noqa: F811
                                          tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_table_topic(broker.bootstrap, "cdc.users", 1, **{
        "table.topic.transform.value.type": "flatten_debezium",
        "table.topic.convert.key.type": "json", "table.topic.commit.interval.ms": "300"})
    create_table_topic(broker.bootstrap, "whole", 1, **{
        "table.topic.transform.value.type": "none", "table.topic.commit.interval.ms": "300"})
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    v1, v2 = {"id": 1, "name": "ada"}, {"id": 1, "name": "ada l.", "tier": "gold"}
    events = [change("r", None, v1, 10), change("u", v1, v2, 11), change("d", v2, None, 12),
              None, change("c", None, {"id": 2, "name": "bo"}, 13)]
    for i, e in enumerate(events):
        p.produce("cdc.users", e, key=json.dumps({"id": 1 if i < 4 else 2}).encode())
        p.produce("whole", json.dumps({"n": i, "inner": {"x": str(i)}}).encode())
    assert p.flush(20) == 0

    rows = sorted(wait_rows(data, "cdc_users", 4), key=lambda r: r["_cdc"]["offset"])
    assert [(r["id"], r["name"], r["tier"], r["_cdc"]["op"], r["_cdc"]["ts"]) for r in rows] == [
        (1, "ada", None, "I", 10), (1, "ada l.", "gold", "U", 11),
        (1, "ada l.", "gold", "D", 12), (2, "bo", None, "I", 13)]
    assert all(r["_cdc"]["source"] == "shop.users" for r in rows)
    assert [r["_kafka_key"]["id"] for r in rows] == [1, 1, 1, 2]
    dead = dead_letters(broker.bootstrap, "cdc.users.dlq", 1)
    assert dead[0].value() is None and dead[0].offset() == 0
    assert "null value" in dict(dead[0].headers())["floe.error.reason"].decode()

    whole = wait_rows(data, "whole", 5)
    assert sorted(r["_kafka_value"]["n"] for r in whole) == [0, 1, 2, 3, 4]
    assert {r["_kafka_value"]["inner"]["x"] for r in whole} == {"0", "1", "2", "3", "4"}
    schema = catalog(data).load_table(("default", "whole")).schema()
    assert isinstance(schema.find_field("_kafka_value").field_type, StructType)
    assert [f.name for f in schema.fields] == ["_kafka", "_kafka_value"]


def test_keys_become_the_kafka_key_column(broker: BrokerProcess,  # noqa: F811
                                          tmp_path: Path) -> None:
    """Avro record keys (AvroSerializer, subject <topic>-key) next to JSON Schema values."""
    data = tmp_path / "data"
    create_table_topic(broker.bootstrap, "keyed", 2, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.convert.key.type": "by_schema_id",
        "table.topic.commit.interval.ms": "300"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    kser = AvroSerializer(sr, json.dumps({"type": "record", "name": "Key", "fields": [
        {"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}]}))
    vser = JSONSerializer(json.dumps(JV1), sr)
    kctx = SerializationContext("keyed", MessageField.KEY)
    vctx = SerializationContext("keyed", MessageField.VALUE)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    acked: dict[tuple[int, int], bytes] = {}

    def done(err: Any, m: Any) -> None:
        if err is None:
            acked[(m.partition(), m.offset())] = m.value()

    for i in range(40):
        p.produce("keyed", vser(jevent(i, False), vctx),
                  key=kser({"tenant": f"t{i % 3}", "id": i}, kctx), on_delivery=done)
    p.produce("keyed", vser(jevent(99, False), vctx), key=b"not avro", on_delivery=done)
    assert p.flush(30) == 0 and len(acked) == 41
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(rows) < 40:
        rows = table_rows(data, "keyed")
        time.sleep(0.1)
    sr.close()
    assert len(rows) == 40
    assert {r["_kafka_key"]["id"]: r["_kafka_key"]["tenant"] for r in rows} == {
        i: f"t{i % 3}" for i in range(40)}
    assert all(r["_kafka_key"]["id"] == r["id"] for r in rows)
    key_type = catalog(data).load_table(("default", "keyed")).schema().find_field(
        "_kafka_key").field_type
    assert isinstance(key_type, StructType)
    dead = dead_letters(broker.bootstrap, "keyed.dlq", 1)
    assert dict(dead[0].headers())["floe.error.reason"].decode().startswith("key: ")
