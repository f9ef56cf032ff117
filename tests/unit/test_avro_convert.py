"""Avro (Confluent wire format) -> Arrow for table topics (tabletopic.avroconvert through
tabletopic.schemaconvert): every type, evolution across writer schemas, references, and what
goes to the dead-letter topic."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from broker.protocol.recordcodec import Record
from tabletopic.convert import Conflict
from tabletopic.schemaconvert import SchemaConverter as AvroConverter
from tabletopic.typeconvert import widen

ALL = {
    "type": "record",
    "name": "All",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "by", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "opt", "type": ["null", "string"], "default": None},
        {"name": "rec", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "x", "type": "int"}, {"name": "y", "type": ["null", "long"]}]}},
        {"name": "arr", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": "double"}},
        {"name": "date", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tus", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "tsms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsus", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal",
                                 "precision": 10, "scale": 2}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}
UTC = dt.UTC
U = uuid.UUID("12345678-1234-5678-1234-567812345678")
VALUE: dict[str, Any] = {
    "b": True, "i": 7, "l": 2**40, "f": 1.5, "d": 2.25, "s": "héllo", "by": b"\x00\x01",
    "fx": b"abcd", "e": "GREEN", "opt": None, "rec": {"x": 1, "y": None}, "arr": [1, 2, 3],
    "m": {"a": 1.0, "b": 2.0}, "date": dt.date(2024, 2, 29), "tms": dt.time(12, 30, 1, 5000),
    "tus": dt.time(1, 2, 3, 456789), "tsms": dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
    "tsus": dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), "dec": Decimal("12345.67"),
    "u": U,
}


def wire(schema_id: int, schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), value)
    return b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()


def rec(offset: int, value: bytes | None) -> Record:
    return Record(offset, 1_700_000_000_000 + offset, None, value, ())


def test_every_type() -> None:
    c = AvroConverter()
    c.add_schema(1, "AVRO", json.dumps(ALL))
    table, dead = c.convert(0, [rec(0, wire(1, ALL, VALUE)), rec(1, None)])
    assert dead == [] and table is not None
    types = {f.name: f.type for f in table.schema}
    assert types["b"] == pa.bool_() and types["i"] == pa.int32() and types["l"] == pa.int64()
    assert types["f"] == pa.float32() and types["d"] == pa.float64()
    assert types["s"] == pa.string() and types["e"] == pa.string() and types["u"] == pa.string()
    assert types["by"] == pa.binary() and types["fx"] == pa.binary()
    assert types["rec"] == pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.int64())])
    assert types["arr"] == pa.list_(pa.int64())
    assert types["m"] == pa.map_(pa.string(), pa.float64())
    assert types["date"] == pa.date32()
    assert types["tms"] == pa.int64() and types["tus"] == pa.int64()  # micros since midnight
    assert types["tsms"] == pa.timestamp("us", tz="UTC") == types["tsus"]
    assert types["dec"] == pa.decimal128(10, 2)
    row, tomb = table.to_pylist()
    assert row["_kafka"]["offset"] == 0 and tomb["_kafka"]["offset"] == 1
    assert tomb["s"] is None
    want = {**VALUE, "u": str(U), "m": [("a", 1.0), ("b", 2.0)],
            "tms": (12 * 3600 + 30 * 60 + 1) * 10**6 + 5000, "tus": 3723 * 10**6 + 456789}
    for k, v in want.items():
        assert row[k] == v, k


def test_evolution_adds_columns_and_promotes() -> None:
    v1 = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "int"}, {"name": "score", "type": "float"}]}
    v2 = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "long"}, {"name": "score", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None}]}
    c = AvroConverter()
    c.add_schema(1, "AVRO", json.dumps(v1))
    c.add_schema(2, "AVRO", json.dumps(v2))
    t1, _ = c.convert(0, [rec(0, wire(1, v1, {"id": 1, "score": 0.5}))])
    assert t1 is not None and t1.schema.field("id").type == pa.int32()
    t2, dead = c.convert(0, [rec(1, wire(2, v2, {"id": 2**40, "score": 0.25, "note": "n"})),
                             rec(2, wire(1, v1, {"id": 3, "score": 1.5}))])
    assert dead == [] and t2 is not None
    assert t2.schema.field("id").type == pa.int64()
    assert t2.schema.field("score").type == pa.float64()
    assert [r["note"] for r in t2.to_pylist()] == ["n", None]
    assert [r["id"] for r in t2.to_pylist()] == [2**40, 3]
    both = pa.concat_tables([t1, t2], promote_options="permissive")
    assert both.column("note").to_pylist() == [None, "n", None]


def test_change_iceberg_cannot_express_is_invalid_with_reason() -> None:
    v1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}
    v2 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    c = AvroConverter()
    c.add_schema(1, "AVRO", json.dumps(v1))
    c.add_schema(2, "AVRO", json.dumps(v2))
    table, dead = c.convert(0, [rec(0, wire(1, v1, {"a": "x"})), rec(1, wire(2, v2, {"a": 1}))])
    assert table is not None and table.num_rows == 1
    assert [d.record.offset for d in dead] == [1]
    assert "Iceberg cannot" in dead[0].reason and "schema id 2" in dead[0].reason
    assert c.fields == {"a": pa.string()}


def test_bad_records_are_invalid_with_reason() -> None:
    s = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    c = AvroConverter()
    c.add_schema(1, "AVRO", json.dumps(s))
    c.add_unknown(9, "not in the schema registry")
    c.add_schema(3, "XML", "<schema/>")
    c.add_schema(4, "AVRO", json.dumps({"type": "record", "name": "U", "fields": [
        {"name": "u", "type": ["int", "string"]}]}))
    good = wire(1, s, {"a": 5})
    records = [rec(0, b"plain text"), rec(1, b"\x00\x00\x00\x00\x09" + good[5:]),
               rec(2, good[:5]), rec(3, b"\x00\x00\x00\x00\x03{}"),
               rec(4, b"\x00\x00\x00\x00\x04\x00\x02"), rec(5, good)]
    assert c.missing_ids(records) == set()
    table, dead = c.convert(0, records)
    assert table is not None and table.column("a").to_pylist() == [5]
    reasons = {d.record.offset: d.reason for d in dead}
    assert "wire format" in reasons[0]
    assert "not in the schema registry" in reasons[1]
    assert "schema id 1: cannot decode" in reasons[2]
    assert "unknown schema type XML" in reasons[3]
    assert "union of 2 non-null" in reasons[4]


def test_missing_ids_and_restart_from_table_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    s = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    c = AvroConverter(known=pa.schema([pa.field("a", pa.int64())]))
    assert c.missing_ids([rec(0, wire(7, s, {"a": 1})), rec(1, b"x")]) == {7}
    c.add_unknown(7, "not in the schema registry")
    assert c.missing_ids([rec(0, wire(7, s, {"a": 1}))]) == set()
    import tabletopic.schemaconvert as sc

    monkeypatch.setattr(sc, "RECHECK_UNKNOWN_S", -1.0)  # an unknown id is asked for again
    assert c.missing_ids([rec(0, wire(7, s, {"a": 1}))]) == {7}
    c.add_schema(7, "AVRO", json.dumps(s))
    table, _ = c.convert(0, [rec(0, wire(7, s, {"a": 1}))])
    assert table is not None and table.schema.field("a").type == pa.int64()  # kept wide


def test_widen() -> None:
    assert widen(pa.int32(), pa.int64()) == pa.int64()
    assert widen(pa.float64(), pa.float32()) == pa.float64()
    with pytest.raises(Conflict):
        widen(pa.int64(), pa.float64())
    assert widen(pa.decimal128(10, 2), pa.decimal128(12, 2)) == pa.decimal128(12, 2)
    assert widen(pa.decimal128(12, 2), pa.decimal128(10, 2)) == pa.decimal128(12, 2)
    with pytest.raises(Conflict):
        widen(pa.decimal128(10, 2), pa.decimal128(12, 3))
    with pytest.raises(Conflict):
        widen(pa.map_(pa.string(), pa.int64()), pa.map_(pa.int32(), pa.int64()))


def test_table_schema_read_back_matches_after_restart(tmp_path: Any) -> None:
    """A writer restarting from the Iceberg table's schema (pyiceberg's Arrow types: large_*,
    list `element`, map key/value) knows every column as the one that made it: no spurious
    evolution, the same Arrow types for the next batch."""
    from pyiceberg.catalog.sql import SqlCatalog

    from tabletopic.commit import covers

    c = AvroConverter()
    c.add_schema(1, "AVRO", json.dumps(ALL))
    table, _ = c.convert(0, [rec(0, wire(1, ALL, VALUE))])
    assert table is not None
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    cat.create_namespace("d")
    t = cat.create_table(("d", "all"), schema=table.schema)
    t.append(table)
    t = cat.load_table(("d", "all"))
    assert covers(t, table.schema)
    again = AvroConverter(known=t.schema().as_arrow())
    assert again.fields == c.fields
    again.add_schema(1, "AVRO", json.dumps(ALL))
    t2, dead = again.convert(0, [rec(1, wire(1, ALL, VALUE))])
    assert dead == [] and t2 is not None and t2.schema == table.schema


def test_references_and_named_types_used_again() -> None:
    """A record type defined in a referenced schema, and a named type used twice by name."""
    addr = {"type": "record", "name": "Addr", "namespace": "n", "fields": [
        {"name": "zip", "type": "string"}]}
    main = {"type": "record", "name": "R", "namespace": "n", "fields": [
        {"name": "home", "type": "n.Addr"}, {"name": "work", "type": ["null", "n.Addr"]}]}
    c = AvroConverter()
    c.add_schema(5, "AVRO", json.dumps(main), [("n.Addr", json.dumps(addr))])
    named: dict[str, Any] = {}
    fastavro.parse_schema(addr, named_schemas=named)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(main, named_schemas=named),
                               {"home": {"zip": "1"}, "work": None})
    table, dead = c.convert(0, [rec(0, b"\x00\x00\x00\x00\x05" + buf.getvalue())])
    assert dead == [] and table is not None
    assert table.to_pylist()[0]["home"] == {"zip": "1"}
    assert table.schema.field("work").type == pa.struct([pa.field("zip", pa.string())])
    recursive = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]}
    c.add_schema(6, "AVRO", json.dumps(recursive))
    _t, dead = c.convert(0, [rec(1, b"\x00\x00\x00\x00\x06\x00")])
    assert "recursive" in dead[0].reason


def test_by_latest_schema_reads_bare_avro() -> None:
    s = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    c = AvroConverter("by_latest_schema")
    c.add_schema(4, "AVRO", json.dumps(s))
    c.latest = 4
    bare = wire(4, s, {"a": 9})[5:]  # no magic byte, no id: the value is the Avro body only
    table, dead = c.convert(0, [rec(0, bare), rec(1, b"\x80")])
    assert table is not None and table.column("a").to_pylist() == [9]
    assert "schema id 4: cannot decode" in dead[0].reason
