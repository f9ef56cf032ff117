"""Keys as the `_kafka_key` column (tabletopic.keyconvert): raw, string, json and by_schema_id
keys next to any value type, null keys, bad keys (invalid, "key: ..."), key evolution and a
restart from the table's schema; `none` (the default) adds no column."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pyarrow as pa

from broker.protocol.recordcodec import Record
from tabletopic.config import TableTopicConfig
from tabletopic.keyconvert import KeyedConverter, converter, schema_parts
from tabletopic.schemaconvert import SchemaConverter


def cfg(**kv: str) -> TableTopicConfig:
    return TableTopicConfig.of("t", {f"table.topic.{k.replace('_', '.')}": v
                                     for k, v in kv.items()})


def rec(offset: int, key: bytes | None, value: bytes | None) -> Record:
    return Record(offset, 1_700_000_000_000 + offset, key, value, ())


def test_no_key_column_by_default() -> None:
    c = converter(cfg(convert_value_type="json"))
    assert not isinstance(c, KeyedConverter)
    table, _ = c.convert(0, [rec(0, b"k", b'{"a": 1}')])
    assert table is not None and "_kafka_key" not in table.column_names


def test_raw_and_string_keys() -> None:
    raw = converter(cfg(convert_value_type="json", convert_key_type="raw"))
    table, dead = raw.convert(0, [rec(0, b"\xff", b'{"a": 1}'), rec(1, None, b'{"a": 2}')])
    assert dead == [] and table is not None
    assert table.schema.field("_kafka_key").type == pa.binary()
    assert table.column("_kafka_key").to_pylist() == [b"\xff", None]
    text = converter(cfg(convert_value_type="string", convert_key_type="string"))
    table, dead = text.convert(0, [rec(0, b"k1", b"v"), rec(1, b"\xff", b"v"),
                                   rec(2, b"k2", b"\xfe")])
    assert table is not None and table.column("_kafka_key").to_pylist() == ["k1"]
    assert [(d.record.offset, d.reason[:5]) for d in dead] == [(1, "key: "), (2, "value")]


def test_json_keys_evolve_and_restart_from_the_table_schema() -> None:
    c = converter(cfg(convert_value_type="raw", convert_key_type="json"))
    t1, _ = c.convert(0, [rec(0, b'{"id": 1}', b"v"), rec(1, None, b"v")])
    assert t1 is not None
    assert t1.schema.field("_kafka_key").type == pa.struct([pa.field("id", pa.int64())])
    assert t1.column("_kafka_key").to_pylist() == [{"id": 1}, None]
    t2, dead = c.convert(0, [rec(2, b'{"id": 2, "region": "eu"}', b"v"), rec(3, b"[1]", b"v"),
                             rec(4, b'{"id": "x"}', b"v")])
    assert t2 is not None and t2.column("_kafka_key").to_pylist() == [
        {"id": 2, "region": "eu"}]
    assert [d.record.offset for d in dead] == [3, 4]
    assert all(d.reason.startswith("key: invalid JSON record") for d in dead)
    again = converter(cfg(convert_value_type="raw", convert_key_type="json"), t2.schema)
    assert isinstance(again, KeyedConverter)
    t3, _ = again.convert(0, [rec(5, b'{"id": 3}', b"v")])
    assert t3 is not None and t3.schema == t2.schema  # value columns and key fields kept


def test_schema_keys_with_schema_values() -> None:
    key_schema = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(key_schema), {"id": 7})
    key = b"\x00\x00\x00\x00\x02" + buf.getvalue()
    value = b"\x00\x00\x00\x00\x01" + json.dumps({"n": 1}).encode()
    c = converter(cfg(convert_value_type="by_schema_id", convert_key_type="by_schema_id"))
    parts = schema_parts(c, [rec(0, key, value)], cfg(convert_key_type="by_schema_id"))
    assert [(p[0].missing_ids(p[1]), p[2]) for p in parts] == [({1}, "t-value"), ({2}, "t-key")]
    values, keys = parts[0][0], parts[1][0]
    values.add_schema(1, "JSON", json.dumps({"type": "object", "properties": {
        "n": {"type": "integer"}}}))
    keys.add_schema(2, "AVRO", json.dumps(key_schema))
    table, dead = c.convert(0, [rec(0, key, value), rec(1, b"plain", value)])
    assert table is not None and table.to_pylist()[0]["_kafka_key"] == {"id": 7}
    assert table.column("n").to_pylist() == [1]
    assert dead[0].record.offset == 1 and dead[0].reason.startswith("key: not the Confluent")


def test_schema_keys_of_any_type() -> None:
    """An Avro `string` key (what AvroSerializer writes for a str) is a string _kafka_key;
    widening (int -> long) and a restart from the table's schema work as for values."""
    def avro(schema: Any, sid: int, v: Any) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), v)
        return b"\x00" + sid.to_bytes(4, "big") + buf.getvalue()

    settings = cfg(convert_value_type="raw", convert_key_type="by_schema_id")
    c = converter(settings)
    assert isinstance(c, KeyedConverter) and isinstance(c.keys, SchemaConverter)
    c.keys.add_schema(1, "AVRO", '"string"')
    c.keys.add_schema(2, "AVRO", '"int"')
    t, dead = c.convert(0, [rec(0, avro("string", 1, "user-1"), b"v"), rec(1, None, b"v")])
    assert dead == [] and t is not None
    assert t.schema.field("_kafka_key").type == pa.string()
    assert t.column("_kafka_key").to_pylist() == ["user-1", None]
    _t, dead = c.convert(0, [rec(2, avro("int", 2, 5), b"v")])
    assert "key: schema id 2: field change Iceberg cannot express" in dead[0].reason
    again = converter(settings, t.schema)
    assert isinstance(again, KeyedConverter) and isinstance(again.keys, SchemaConverter)
    again.keys.add_schema(1, "AVRO", '"string"')
    t2, _ = again.convert(0, [rec(3, avro("string", 1, "u"), b"v")])
    assert t2 is not None and t2.schema == t.schema
