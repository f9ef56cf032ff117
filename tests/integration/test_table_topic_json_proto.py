"""Table topics with `table.topic.convert.value.type=by_schema_id` for JSON Schema and Protobuf:
confluent-kafka's JSONSerializer / ProtobufSerializer produce through a real broker with its
Schema Registry, pyiceberg reads the table. v1 records, then v2 (a new optional field) registered
mid-stream by the serializer: typed columns, every acked record exactly once, the new column
null for v1 rows and set for v2 rows, bad records in <topic>.dlq with the reason. Also
by_latest_schema (bare Protobuf messages read with the subject's latest version), and a change
Iceberg cannot express stopping the partition with errors.tolerance=none."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import message_factory
from pyiceberg.types import (
    DateType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestamptzType,
)

from broker.schemaregistry.protobuf import descriptor_pool_of
from tests.brokerproc import BrokerProcess
from tests.integration.test_schema_registry import registry_address
from tests.integration.test_table_topic import catalog, create_table_topic, keys_of, table_rows
from tests.integration.test_table_topic_avro import (  # noqa: F401 (broker: a fixture)
    broker,
    dead_letters,
    produce,
    wait_for,
)

with warnings.catch_warnings():  # authlib (imported by the client) warns about httpx
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

pytestmark = pytest.mark.integration

PROPS: dict[str, Any] = {
    "id": {"type": "integer"},
    "name": {"type": "string"},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "addr": {"type": "object", "properties": {"zip": {"type": "string"}},
             "additionalProperties": False},
    "day": {"type": "string", "format": "date"},
    "at": {"type": "string", "format": "date-time"},
    "maybe": {"type": ["string", "null"]},
}
JV1 = {"type": "object", "title": "Event", "properties": PROPS, "required": ["id", "name"],
       "additionalProperties": False}
JV2 = {**JV1, "properties": {**PROPS, "note": {"type": ["null", "string"]}}}


def jevent(i: int, v2: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": i, "name": f"user-{i}", "score": i / 4, "tags": ["t", str(i % 5)],
        "addr": {"zip": f"{i:05d}"}, "day": str(dt.date(2024, 1, 1) + dt.timedelta(i % 300)),
        "at": f"2024-05-01T00:00:{i % 60:02d}Z", "maybe": None if i % 2 else "m"}
    if v2:
        d["note"] = f"note-{i}"
    return d


def test_json_schema_v1_then_v2_typed_columns_exactly_once(broker: BrokerProcess,  # noqa: F811
                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_table_topic(broker.bootstrap, "events.json", 2, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.commit.interval.ms": "500"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    ctx = SerializationContext("events.json", MessageField.VALUE)
    ser1 = JSONSerializer(json.dumps(JV1), sr)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5,
                  "enable.idempotence": True})
    acked: dict[tuple[int, int], bytes] = {}
    produce(p, "events.json", [ser1(jevent(i, False), ctx) for i in range(200)], acked)
    wait_for(data, "events_json", set(acked), 20)
    ser2 = JSONSerializer(json.dumps(JV2), sr)  # registers v2 on first use, mid-stream
    t2 = produce(p, "events.json", [ser2(jevent(i, True), ctx) for i in range(200, 400)], acked)
    _rows, seen2 = wait_for(data, "events_json", set(acked), 20)
    print(f"freshness across the JSON Schema change: {seen2 - t2:.2f}s after the last v2 ack"
          " (commit.interval.ms=500)")
    bad: dict[tuple[int, int], bytes] = {}
    produce(p, "events.json", [b'{"id": 1}', b"\x00\x00\x01\x86\xa0{}",
                               b"\x00" + ser1(jevent(0, False), ctx)[1:5] + b'{"id": "x"}'],
            bad)
    produce(p, "events.json", [ser1(jevent(i, False), ctx) for i in range(400, 410)], acked)
    rows, _seen = wait_for(data, "events_json", set(acked), 20)
    sr.close()

    keys = keys_of(rows)
    assert set(keys) == set(acked) and max(keys.values()) == 1, "exactly once"
    assert not set(keys) & set(bad)
    schema = catalog(data).load_table(("default", "events_json")).schema()
    assert schema.find_field("id").field_type == LongType()
    assert schema.find_field("score").field_type == DoubleType()
    assert schema.find_field("day").field_type == DateType()
    assert schema.find_field("at").field_type == TimestamptzType()
    assert schema.find_field("note").field_type == StringType()
    assert isinstance(schema.find_field("tags").field_type, ListType)
    assert isinstance(schema.find_field("addr").field_type, StructType)
    by_id = {r["id"]: r for r in rows}
    for i in (0, 1, 199, 405):
        want = jevent(i, False)
        assert by_id[i]["note"] is None and by_id[i]["name"] == want["name"]
        assert by_id[i]["tags"] == want["tags"] and by_id[i]["addr"] == want["addr"]
        assert by_id[i]["day"] == dt.date.fromisoformat(want["day"])
        assert by_id[i]["at"] == dt.datetime(2024, 5, 1, 0, 0, i % 60, tzinfo=dt.UTC)
        assert by_id[i]["maybe"] == want["maybe"] and by_id[i]["score"] == i / 4
    for i in (200, 399):
        assert by_id[i]["note"] == f"note-{i}"
    dead = dead_letters(broker.bootstrap, "events.json.dlq", 3)
    assert sorted(m.value() for m in dead) == sorted(bad.values())
    reasons = " | ".join(dict(m.headers())["floe.error.reason"].decode() for m in dead)
    assert "wire format" in reasons and "not in the schema registry" in reasons
    assert "is not an integer" in reasons


PV1 = """
syntax = "proto3";
package floe.test;
import "google/protobuf/timestamp.proto";
message Event {
  enum Kind { A = 0; B = 1; }
  message Addr { string zip = 1; optional int32 no = 2; }
  int32 id = 1; string name = 2; Kind kind = 3; repeated string tags = 4;
  map<string, int64> attrs = 5; Addr addr = 6; google.protobuf.Timestamp at = 7;
  double score = 8;
  oneof pick { string word = 9; int64 num = 10; }
}
"""
PV2 = PV1.replace("int64 num = 10; }", "int64 num = 10; }\n  optional string note = 11;") \
    .replace("int32 id = 1", "int64 id = 1")  # int32 -> int64: wire-compatible, a promotion


def proto_class(text: str) -> Any:
    _fdp, pool = descriptor_pool_of(text, [])
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("floe.test.Event"))


def pevent(cls: Any, i: int, v2: bool) -> Any:
    m = cls(id=i, name=f"user-{i}", kind=i % 2, tags=["t", str(i % 5)], score=i / 4)
    m.attrs["n"] = i
    m.addr.zip = f"{i:05d}"
    if i % 3 == 0:
        m.addr.no = i
    m.at.FromDatetime(dt.datetime(2024, 5, 1) + dt.timedelta(milliseconds=i))
    if i % 2:
        m.word = f"w{i}"
    else:
        m.num = i
    if v2:
        m.id = 2**40 + i
        m.note = f"note-{i}"
    return m


def test_protobuf_v1_then_v2_typed_columns_exactly_once(broker: BrokerProcess,  # noqa: F811
                                                        tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_table_topic(broker.bootstrap, "events.proto", 2, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.commit.interval.ms": "500"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    ctx = SerializationContext("events.proto", MessageField.VALUE)
    c1, c2 = proto_class(PV1), proto_class(PV2)
    ser1 = ProtobufSerializer(c1, sr, {"use.deprecated.format": False})
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5,
                  "enable.idempotence": True})
    acked: dict[tuple[int, int], bytes] = {}
    produce(p, "events.proto", [ser1(pevent(c1, i, False), ctx) for i in range(200)], acked)
    wait_for(data, "events_proto", set(acked), 20)
    ser2 = ProtobufSerializer(c2, sr, {"use.deprecated.format": False})
    t2 = produce(p, "events.proto", [ser2(pevent(c2, i, True), ctx) for i in range(200, 400)],
                 acked)
    _rows, seen2 = wait_for(data, "events_proto", set(acked), 20)
    print(f"freshness across the Protobuf schema change: {seen2 - t2:.2f}s after the last v2"
          " ack (commit.interval.ms=500)")
    bad: dict[tuple[int, int], bytes] = {}
    produce(p, "events.proto", [b"plain", ser1(pevent(c1, 1, False), ctx)[:5] + b"\x00\xff"],
            bad)
    produce(p, "events.proto", [ser1(pevent(c1, i, False), ctx) for i in range(400, 410)],
            acked)
    rows, _seen = wait_for(data, "events_proto", set(acked), 20)
    sr.close()

    keys = keys_of(rows)
    assert set(keys) == set(acked) and max(keys.values()) == 1, "exactly once"
    t = catalog(data).load_table(("default", "events_proto"))
    schema = t.schema()
    assert schema.find_field("id").field_type == LongType()  # int32 promoted to int64
    assert schema.find_field("score").field_type == DoubleType()
    assert schema.find_field("note").field_type == StringType()
    assert schema.find_field("kind").field_type == StringType()
    assert schema.find_field("at").field_type == TimestamptzType()
    assert isinstance(schema.find_field("attrs").field_type, MapType)
    addr = schema.find_field("addr").field_type
    assert isinstance(addr, StructType) and addr.field_by_name("no").field_type == IntegerType()
    assert pa.types.is_list(t.scan().to_arrow().schema.field("tags").type) or \
        pa.types.is_large_list(t.scan().to_arrow().schema.field("tags").type)
    by_id = {r["id"]: r for r in rows}
    for i in (0, 1, 3, 199, 405):
        r = by_id[i]
        assert r["note"] is None and r["name"] == f"user-{i}" and r["kind"] == "AB"[i % 2]
        assert r["tags"] == ["t", str(i % 5)] and dict(r["attrs"]) == {"n": i}
        assert r["addr"] == {"zip": f"{i:05d}", "no": i if i % 3 == 0 else None}
        assert r["at"] == dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=i)
        assert (r["word"], r["num"]) == ((f"w{i}", None) if i % 2 else (None, i))
    for i in (200, 399):
        assert by_id[2**40 + i]["note"] == f"note-{i}"
    dead = dead_letters(broker.bootstrap, "events.proto.dlq", 2)
    assert sorted(m.value() for m in dead) == sorted(bad.values())
    reasons = " | ".join(dict(m.headers())["floe.error.reason"].decode() for m in dead)
    assert "wire format" in reasons and "cannot decode" in reasons


def test_by_latest_schema_reads_bare_protobuf(broker: BrokerProcess,  # noqa: F811
                                              tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_table_topic(broker.bootstrap, "bare", 2, **{
        "table.topic.convert.value.type": "by_latest_schema",
        "table.topic.convert.value.subject": "bare-events",
        "table.topic.commit.interval.ms": "300"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    sr.register_schema("bare-events", Schema(PV2, "PROTOBUF"))
    sr.close()
    c2 = proto_class(PV2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    acked: dict[tuple[int, int], bytes] = {}
    produce(p, "bare", [pevent(c2, i, True).SerializeToString() for i in range(50)], acked)
    rows, _seen = wait_for(data, "bare", set(acked), 20)
    assert sorted(r["note"] for r in rows) == sorted(f"note-{i}" for i in range(50))
    assert {r["id"] for r in rows} == {2**40 + i for i in range(50)}


def test_json_schema_change_iceberg_cannot_express_stops_with_tolerance_none(
    broker: BrokerProcess, tmp_path: Path  # noqa: F811
) -> None:
    create_table_topic(broker.bootstrap, "strictjson", 1, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.commit.interval.ms": "300", "table.topic.errors.tolerance": "none"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    sr.set_compatibility("strictjson-value", "NONE")
    ctx = SerializationContext("strictjson", MessageField.VALUE)
    s1 = {"type": "object", "properties": {"a": {"type": "string"}}}
    s2 = {"type": "object", "properties": {"a": {"type": "integer"}}}
    ser1, ser2 = JSONSerializer(json.dumps(s1), sr), JSONSerializer(json.dumps(s2), sr)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for v in [ser1({"a": "x"}, ctx), ser1({"a": "y"}, ctx), ser2({"a": 1}, ctx),
              ser1({"a": "z"}, ctx)]:
        p.produce("strictjson", v, partition=0)
        assert p.flush(10) == 0
    sr.close()
    metrics = broker.log().split("metrics on ", 1)[1].split()[0]
    deadline = time.monotonic() + 20
    stopped = None
    while time.monotonic() < deadline and not stopped:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://{metrics}/status", timeout=5) as r:
                status = json.load(r)
            for tbl in status["tables"]:
                if tbl["topic"] == "strictjson" and tbl["partitions"]:  # once started
                    stopped = tbl["partitions"][0]["stopped"]
        time.sleep(0.2)
    assert stopped is not None and stopped.startswith("offset 2:"), stopped
    assert "Iceberg cannot" in stopped and "errors.tolerance=none" in stopped
    deadline = time.monotonic() + 10
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(rows) < 2:
        rows = table_rows(tmp_path / "data", "strictjson")
        time.sleep(0.2)
    time.sleep(1)
    assert sorted(r["a"] for r in table_rows(tmp_path / "data", "strictjson")) == ["x", "y"]
