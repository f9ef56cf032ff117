"""JSON Schema (Confluent wire format) -> Arrow for table topics (tabletopic.jsonschemaconvert
through tabletopic.schemaconvert): every type, nullability, $refs, evolution across writer
schemas, and what goes to the dead-letter topic."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest

from broker.protocol.recordcodec import Record
from tabletopic.convert import Conflict
from tabletopic.jsonschemaconvert import parse_json_schema
from tabletopic.schemaconvert import SchemaConverter

ALL: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "All",
    "type": "object",
    "definitions": {"Point": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}}}},
    "properties": {
        "b": {"type": "boolean"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "s": {"type": "string"},
        "opt": {"type": ["string", "null"]},
        "one": {"oneOf": [{"type": "null"}, {"type": "integer"}]},
        "color": {"enum": ["RED", "GREEN"]},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "t": {"type": "string", "format": "time"},
        "u": {"type": "string", "format": "uuid"},
        "rec": {"type": "object", "properties": {
            "x": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}},
        "pts": {"type": "array", "items": {"$ref": "#/definitions/Point"}},
        "m": {"type": "object", "additionalProperties": {"type": "integer"}},
        "free": {},
        "anyobj": {"type": "object"},
    },
    "required": ["b", "i"],
}
VALUE: dict[str, Any] = {
    "b": True, "i": 2**40, "n": 1.5, "s": "héllo", "opt": None, "one": 3, "color": "GREEN",
    "day": "2024-02-29", "at": "2024-01-02T03:04:05.678+01:00", "t": "12:30:01.5Z",
    "u": "12345678-1234-5678-1234-567812345678", "rec": {"x": 1, "tags": ["a", "b"]},
    "pts": [{"x": 1, "y": 2.5}], "m": {"a": 1, "b": 2}, "free": {"k": [1, "x"]},
    "anyobj": {"z": True}, "extra": "dropped",
}


def wire(schema_id: int, value: Any) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + json.dumps(value).encode()


def rec(offset: int, value: bytes | None) -> Record:
    return Record(offset, 1_700_000_000_000 + offset, None, value, ())


def test_every_type() -> None:
    c = SchemaConverter()
    c.add_schema(1, "JSON", json.dumps(ALL))
    table, dead = c.convert(0, [rec(0, wire(1, VALUE)), rec(1, None),
                                rec(2, wire(1, {"b": False, "i": 1}))])
    assert dead == [] and table is not None
    types = {f.name: f.type for f in table.schema}
    assert types["b"] == pa.bool_() and types["i"] == pa.int64() and types["n"] == pa.float64()
    assert types["s"] == types["opt"] == types["color"] == types["u"] == pa.string()
    assert types["one"] == pa.int64()
    assert types["day"] == pa.date32() and types["t"] == pa.int64()  # micros since midnight
    assert types["at"] == pa.timestamp("us", tz="UTC")
    assert types["rec"] == pa.struct([pa.field("x", pa.int64()),
                                      pa.field("tags", pa.list_(pa.string()))])
    assert types["pts"] == pa.list_(pa.struct([pa.field("x", pa.float64()),
                                               pa.field("y", pa.float64())]))
    assert types["m"] == pa.map_(pa.string(), pa.int64())
    assert types["free"] == types["anyobj"] == pa.string()  # kept as JSON text
    assert "extra" not in types
    row, tomb, sparse = table.to_pylist()
    assert row["_kafka"]["offset"] == 0 and tomb["b"] is None
    assert row["i"] == 2**40 and row["n"] == 1.5 and row["s"] == "héllo" and row["one"] == 3
    assert row["day"] == dt.date(2024, 2, 29)
    assert row["at"] == dt.datetime(2024, 1, 2, 2, 4, 5, 678000, tzinfo=dt.UTC)
    assert row["t"] == (12 * 3600 + 30 * 60 + 1) * 10**6 + 500000
    assert row["rec"] == {"x": 1, "tags": ["a", "b"]}
    assert row["pts"] == [{"x": 1.0, "y": 2.5}] and row["m"] == [("a", 1), ("b", 2)]
    assert json.loads(row["free"]) == {"k": [1, "x"]} and json.loads(row["anyobj"]) == {"z": True}
    assert sparse["b"] is False and sparse["rec"] is None and sparse["day"] is None


def test_evolution_adds_columns_and_keeps_rows_of_both() -> None:
    v1 = {"type": "object", "properties": {"id": {"type": "integer"}}}
    v2 = {"type": "object", "properties": {"id": {"type": "integer"},
                                           "note": {"type": ["null", "string"]},
                                           "rec": {"type": "object", "properties": {
                                               "a": {"type": "integer"}}}}}
    c = SchemaConverter(known=pa.schema([pa.field("id", pa.int64())]))
    c.add_schema(1, "JSON", json.dumps(v1))
    c.add_schema(2, "JSON", json.dumps(v2))
    t, dead = c.convert(0, [rec(0, wire(1, {"id": 1})),
                            rec(1, wire(2, {"id": 2, "note": "n", "rec": {"a": 5}})),
                            rec(2, wire(1, {"id": 3}))])
    assert dead == [] and t is not None
    assert [r["note"] for r in t.to_pylist()] == [None, "n", None]
    assert [r["rec"] for r in t.to_pylist()] == [None, {"a": 5}, None]


def test_bad_values_and_changes_iceberg_cannot_express_are_invalid() -> None:
    s = {"type": "object", "properties": {"a": {"type": "integer"},
                                          "d": {"type": "string", "format": "date"}}}
    changed = {"type": "object", "properties": {"a": {"type": "string"}}}
    c = SchemaConverter()
    c.add_schema(1, "JSON", json.dumps(s))
    c.add_schema(2, "JSON", json.dumps(changed))
    c.add_schema(3, "JSON", json.dumps({"type": "object", "properties": {
        "u": {"type": ["string", "integer"]}}}))
    c.add_schema(4, "JSON", json.dumps({"type": "array", "items": {"type": "string"}}))
    c.add_schema(5, "JSON", json.dumps({"type": "object", "properties": {
        "r": {"$ref": "other.json#/x"}}}))
    c.add_schema(6, "JSON", "{not json")
    records = [rec(0, wire(1, {"a": "x"})), rec(1, wire(1, {"a": 2**64})),
               rec(2, wire(1, {"d": "yesterday"})), rec(3, b"\x00\x00\x00\x00\x01{bad"),
               rec(4, wire(2, {"a": "s"})), rec(5, wire(3, {"u": 1})), rec(6, wire(4, ["a"])),
               rec(7, wire(5, {})), rec(8, wire(6, {})), rec(9, wire(1, {"a": 7})),
               rec(10, wire(1, [1]))]
    table, dead = c.convert(0, records)
    assert table is not None and table.column("a").to_pylist() == [7]
    reasons = {d.record.offset: d.reason for d in dead}
    assert sorted(reasons) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert "is not an integer" in reasons[0] and "does not fit a long" in reasons[1]
    assert "schema id 1: cannot decode" in reasons[2] and "cannot decode" in reasons[3]
    assert "Iceberg cannot" in reasons[4] and "schema id 2" in reasons[4]
    assert "no single Iceberg type" in reasons[5]
    assert "not a record" in reasons[6] and "another document" in reasons[7]
    assert "schema id 6" in reasons[8] and "is not an object" in reasons[10]


def test_recursive_definitions_have_no_iceberg_form() -> None:
    tree = {"type": "object", "definitions": {"N": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/definitions/N"}}}}},
        "properties": {"root": {"$ref": "#/definitions/N"}}}
    with pytest.raises(Conflict, match="recursive"):
        parse_json_schema(json.dumps(tree), [])
