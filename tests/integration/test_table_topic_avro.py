"""Table topics with `table.topic.convert.value.type=by_schema_id`: confluent-kafka's
AvroSerializer produces through a real broker with its Schema Registry, pyiceberg reads the
table. v1 records, then v2 (a new optional field, int -> long and float -> double) registered
mid-stream: typed columns, every acked record exactly once, the new column null for v1 rows and
set for v2 rows, bad records in <topic>.dlq with the reason. An incompatible change (string ->
int) with errors.tolerance=none stops the partition and /status (floe table status) says why."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.types import DoubleType, LongType, StringType, TimestamptzType

from tests.brokerproc import BrokerProcess
from tests.integration.test_schema_registry import registry_address
from tests.integration.test_table_topic import (
    catalog,
    create_table_topic,
    keys_of,
    table_rows,
)

with warnings.catch_warnings():  # authlib (imported by the client) warns about httpx
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

pytestmark = pytest.mark.integration

BASE = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "addr", "type": {"type": "record", "name": "Addr", "fields": [
        {"name": "zip", "type": "string"}, {"name": "no", "type": ["null", "int"]}]}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                "precision": 12, "scale": 2}},
    {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "maybe", "type": ["null", "string"], "default": None},
]
V1 = {"type": "record", "name": "Event", "namespace": "floe.test", "fields": [
    *BASE, {"name": "count", "type": "int"}, {"name": "score", "type": "float"}]}
V2 = {"type": "record", "name": "Event", "namespace": "floe.test", "fields": [
    *BASE, {"name": "count", "type": "long"}, {"name": "score", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": None}]}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(data_dir=tmp_path / "data", registry_listen="127.0.0.1:0",
                      extra_args=["--metrics", "127.0.0.1:0"]).start()
    try:
        yield b
    finally:
        b.stop()


def event(i: int, v2: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": i, "name": f"user-{i}", "kind": "AB"[i % 2], "tags": ["t", str(i % 5)],
        "attrs": {"n": i}, "addr": {"zip": f"{i:05d}", "no": None if i % 3 else i},
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=i % 300),
        "at": dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=i),
        "amount": Decimal(i) / 100, "uid": uuid.UUID(int=i), "maybe": None if i % 2 else "m",
        "count": i, "score": i / 4,
    }
    if v2:
        d["count"] = 2**40 + i
        d["note"] = f"note-{i}"
    return d


def produce(p: Producer, topic: str, values: list[bytes], acked: dict[tuple[int, int], bytes]
            ) -> float:
    """Produce, wait for every ack; the monotonic time of the last ack."""
    last = [0.0]

    def done(err: Any, m: Any) -> None:
        if err is None:
            acked[(m.partition(), m.offset())] = m.value()
            last[0] = time.monotonic()

    for i, v in enumerate(values):
        p.produce(topic, v, key=str(i).encode(), partition=i % 2, on_delivery=done)
        p.poll(0)
    assert p.flush(30) == 0
    return last[0]


def wait_for(data_dir: Path, table: str, keys: set[tuple[int, int]], timeout: float
             ) -> tuple[list[dict[str, Any]], float]:
    """Rows once the table holds every key; and when that was seen (monotonic)."""
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = table_rows(data_dir, table)
        if keys <= set(keys_of(rows)):
            return rows, time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"table has {len(rows)} rows, {len(keys - set(keys_of(rows)))} missing")


def dead_letters(bootstrap: str, topic: str, want: int) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-check",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(out) < want:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            out.append(m)
    c.close()
    return out


def test_avro_v1_then_v2_typed_columns_exactly_once(broker: BrokerProcess,
                                                    tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_table_topic(broker.bootstrap, "events.avro", 2, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.commit.interval.ms": "500"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    ctx = SerializationContext("events.avro", MessageField.VALUE)
    ser1 = AvroSerializer(sr, json.dumps(V1))
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5,
                  "enable.idempotence": True})
    acked: dict[tuple[int, int], bytes] = {}
    t1 = produce(p, "events.avro", [ser1(event(i, False), ctx) for i in range(300)], acked)
    v1_keys = set(acked)
    _rows, seen1 = wait_for(data, "events_avro", v1_keys, 20)
    # v2 registered mid-stream (the serializer registers it on first use)
    ser2 = AvroSerializer(sr, json.dumps(V2))
    t2 = produce(p, "events.avro", [ser2(event(i, True), ctx) for i in range(300, 600)], acked)
    bad = {}
    bad_values = [b"not avro at all", b"\x00\x00\x01\x86\xa0" + b"\x02"]  # id 100000: unknown
    produce(p, "events.avro", bad_values, bad)
    produce(p, "events.avro", [ser1(event(i, False), ctx) for i in range(600, 610)], acked)
    rows, seen2 = wait_for(data, "events_avro", set(acked), 20)
    sr.close()

    keys = keys_of(rows)
    assert set(keys) == set(acked) and max(keys.values()) == 1, "exactly once"
    assert not set(keys) & set(bad)
    t = catalog(data).load_table(("default", "events_avro"))
    schema = t.schema()
    assert schema.find_field("count").field_type == LongType()  # int promoted to long
    assert schema.find_field("score").field_type == DoubleType()  # float promoted to double
    assert schema.find_field("note").field_type == StringType()
    assert schema.find_field("at").field_type == TimestamptzType()
    arrow = t.scan().to_arrow()
    assert pa.types.is_decimal(arrow.schema.field("amount").type)
    assert arrow.schema.field("amount").type.scale == 2
    assert pa.types.is_date32(arrow.schema.field("day").type)
    assert pa.types.is_map(arrow.schema.field("attrs").type)
    assert pa.types.is_struct(arrow.schema.field("addr").type)
    by_id = {r["id"]: r for r in rows}
    for i in (0, 1, 2, 299, 605):
        r, want = by_id[i], event(i, False)
        assert r["note"] is None and r["count"] == i and r["score"] == i / 4
        assert r["name"] == want["name"] and r["kind"] == want["kind"]
        assert r["tags"] == want["tags"] and dict(r["attrs"]) == want["attrs"]
        assert r["addr"] == want["addr"] and r["day"] == want["day"]
        assert r["at"] == want["at"] and r["amount"] == want["amount"]
        assert r["uid"] == str(want["uid"]) and r["maybe"] == want["maybe"]
    for i in (300, 450, 599):
        assert by_id[i]["note"] == f"note-{i}" and by_id[i]["count"] == 2**40 + i

    dead = dead_letters(broker.bootstrap, "events.avro.dlq", 2)
    assert sorted(m.value() for m in dead) == sorted(bad.values())
    reasons = sorted(dict(m.headers())["floe.error.reason"].decode() for m in dead)
    assert "wire format" in reasons[0] or "wire format" in reasons[1]
    assert any("not in the schema registry" in r for r in reasons), reasons
    print(f"freshness: v1 visible {seen1 - t1:.2f}s after the last ack, across the schema "
          f"change {seen2 - t2:.2f}s (commit.interval.ms=500)")


def test_incompatible_change_stops_the_partition_with_tolerance_none(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    create_table_topic(broker.bootstrap, "strict", 1, **{
        "table.topic.convert.value.type": "by_schema_id",
        "table.topic.commit.interval.ms": "300", "table.topic.errors.tolerance": "none"})
    sr = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    sr.set_compatibility("strict-value", "NONE")
    ctx = SerializationContext("strict", MessageField.VALUE)
    s1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}
    s2 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    ser1, ser2 = AvroSerializer(sr, json.dumps(s1)), AvroSerializer(sr, json.dumps(s2))
    p = Producer({"bootstrap.servers": broker.bootstrap})
    values = [ser1({"a": "x"}, ctx), ser1({"a": "y"}, ctx), ser2({"a": 1}, ctx),
              ser1({"a": "z"}, ctx)]
    for v in values:
        p.produce("strict", v, partition=0)
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
                if tbl["topic"] == "strict" and tbl["partitions"]:  # once started
                    stopped = tbl["partitions"][0]["stopped"]
        time.sleep(0.2)
    assert stopped is not None and stopped.startswith("offset 2:"), stopped
    assert "Iceberg cannot" in stopped and "errors.tolerance=none" in stopped
    deadline = time.monotonic() + 10
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(rows) < 2:
        rows = table_rows(tmp_path / "data", "strict")
        time.sleep(0.2)
    time.sleep(1)
    rows = table_rows(tmp_path / "data", "strict")
    assert sorted(r["a"] for r in rows) == ["x", "y"]  # nothing past the stop
