"""table.topic.transform.value.type (tabletopic.transformconvert): none (one _kafka_value
column), flatten_debezium (Debezium change events unwrapped, _cdc) with schemaless JSON and
with Avro envelopes, bad events, restarts from the table's schema, and keys next to them."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import fastavro
import pyarrow as pa

from broker.protocol.recordcodec import Record
from tabletopic.config import TableTopicConfig
from tabletopic.keyconvert import converter
from tabletopic.schemaconvert import SchemaConverter
from tabletopic.transformconvert import TransformedConverter


def cfg(**kv: str) -> TableTopicConfig:
    return TableTopicConfig.of("t", {f"table.topic.{k.replace('_', '.')}": v
                                     for k, v in kv.items()})


def rec(offset: int, value: bytes | None, key: bytes | None = None) -> Record:
    return Record(offset, 1_700_000_000_000 + offset, key, value, ())


def event(op: str | None, before: Any, after: Any, **extra: Any) -> bytes:
    doc = {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_123,
           "source": {"db": "shop", "schema": "public", "table": "users"}, **extra}
    return json.dumps(doc).encode()


def test_none_puts_the_whole_value_in_one_column() -> None:
    c = converter(cfg(convert_value_type="json", transform_value_type="none"))
    assert isinstance(c, TransformedConverter)
    t, dead = c.convert(0, [rec(0, b'{"a": 1, "b": {"c": "x"}}'), rec(1, None)])
    assert dead == [] and t is not None and t.column_names == ["_kafka", "_kafka_value"]
    assert t.column("_kafka_value").to_pylist() == [{"a": 1, "b": {"c": "x"}}, None]
    again = converter(cfg(convert_value_type="json", transform_value_type="none"), t.schema)
    t2, _ = again.convert(0, [rec(2, b'{"a": 2}')])
    assert t2 is not None and t2.schema == t.schema  # the struct's fields known after restart
    raw = converter(cfg(convert_value_type="raw", transform_value_type="none"))
    assert raw.schema().names == ["_kafka", "_kafka_value"]
    t3, _ = raw.convert(0, [rec(0, b"\xff")])
    assert t3 is not None and t3.column("_kafka_value").to_pylist() == [b"\xff"]


def test_flatten_debezium_json_events() -> None:
    c = converter(cfg(convert_value_type="json", transform_value_type="flatten_debezium",
                      convert_key_type="json"))
    row1, row2 = {"id": 1, "name": "ada"}, {"id": 1, "name": "ada l."}
    records = [
        rec(0, event("r", None, row1), b'{"id": 1}'),
        rec(1, event("u", row1, row2), b'{"id": 1}'),
        rec(2, event("d", row2, None), b'{"id": 1}'),
        rec(3, None, b'{"id": 1}'),  # Debezium's tombstone after a delete
        rec(4, event("c", None, {"id": 2, "name": "bo"}, source=None), b'{"id": 2}'),
        rec(5, event("u", row1, None)), rec(6, event(None, None, row1)),
        rec(7, event("d", None, None)),
    ]
    t, dead = c.convert(0, records)
    assert t is not None
    assert t.column_names == ["_kafka", "id", "name", "_cdc", "_kafka_key"]
    rows = t.to_pylist()
    assert [(r["id"], r["name"]) for r in rows] == [(1, "ada"), (1, "ada l."), (1, "ada l."),
                                                    (2, "bo")]
    assert [r["_cdc"]["op"] for r in rows] == ["I", "U", "D", "I"]
    assert [r["_cdc"]["offset"] for r in rows] == [0, 1, 2, 4]
    assert rows[0]["_cdc"]["ts"] == 1_700_000_000_123
    assert rows[0]["_cdc"]["source"] == "public.users" and rows[3]["_cdc"]["source"] is None
    assert rows[1]["_kafka_key"] == {"id": 1}
    reasons = {d.record.offset: d.reason for d in dead}
    assert sorted(reasons) == [3, 5, 6, 7]
    assert "null value" in reasons[3] and "without 'after'" in reasons[5]
    assert "no op" in reasons[6] and "without 'before'" in reasons[7]
    flat = converter(cfg(convert_value_type="json", transform_value_type="flatten_debezium"))
    _t, dead = flat.convert(0, [rec(0, b'{"id": 1}')])
    assert "not a Debezium change event" in dead[0].reason


def test_flatten_debezium_avro_envelope_and_restart() -> None:
    value = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"]}]}
    envelope = {"type": "record", "name": "Envelope", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
            {"name": "db", "type": "string"}, {"name": "table", "type": "string"}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}

    def wire(doc: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(envelope), doc)
        return b"\x00\x00\x00\x00\x01" + buf.getvalue()

    src = {"db": "inventory", "table": "customers"}
    settings = cfg(convert_value_type="by_schema_id", transform_value_type="flatten_debezium")
    c = converter(settings)
    assert isinstance(c, TransformedConverter)
    assert isinstance(c.inner, SchemaConverter)
    c.inner.add_schema(1, "AVRO", json.dumps(envelope))
    t, dead = c.convert(0, [
        rec(0, wire({"before": None, "after": {"id": 1, "email": "a@x"}, "source": src,
                     "op": "c", "ts_ms": 5})),
        rec(1, wire({"before": {"id": 1, "email": "a@x"}, "after": None, "source": src,
                     "op": "d", "ts_ms": None}))])
    assert dead == [] and t is not None
    assert t.schema.field("id").type == pa.int64()
    assert [(r["id"], r["email"], r["_cdc"]["op"], r["_cdc"]["ts"], r["_cdc"]["source"])
            for r in t.to_pylist()] == [(1, "a@x", "I", 5, "inventory.customers"),
                                        (1, "a@x", "D", None, "inventory.customers")]
    again = converter(settings, t.schema)
    assert isinstance(again, TransformedConverter)
    assert isinstance(again.inner, SchemaConverter)
    again.inner.add_schema(1, "AVRO", json.dumps(envelope))
    t2, dead = again.convert(0, [rec(2, wire({"before": None, "after": {"id": 2, "email": None},
                                              "source": src, "op": "r", "ts_ms": 6}))])
    assert dead == [] and t2 is not None and t2.schema == t.schema


def test_none_with_a_json_schema_value() -> None:
    c = converter(cfg(convert_value_type="by_schema_id", transform_value_type="none"))
    assert isinstance(c, TransformedConverter) and isinstance(c.inner, SchemaConverter)
    c.inner.add_schema(1, "JSON", json.dumps({"type": "object", "properties": {
        "a": {"type": "integer"}, "d": {"type": "string", "format": "date"}}}))
    t, dead = c.convert(0, [rec(0, b"\x00\x00\x00\x00\x01" + b'{"a": 1, "d": "2024-01-02"}'),
                            rec(1, None)])
    assert dead == [] and t is not None and t.column_names == ["_kafka", "_kafka_value"]
    assert t.schema.field("_kafka_value").type == pa.struct(
        [pa.field("a", pa.int64()), pa.field("d", pa.date32())])
    assert [r["_kafka_value"] for r in t.to_pylist()] == [
        {"a": 1, "d": dt.date(2024, 1, 2)}, None]
