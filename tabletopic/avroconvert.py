"""Avro writer schemas for tabletopic.schemaconvert: an Avro record schema to typed Arrow
columns, and its binary encoding (fastavro's schemaless_reader) to rows of them.

Avro -> Arrow (-> Iceberg): boolean, int (int32 / int), long (int64 / long), float (float32 /
float), double, string, bytes and fixed (binary), enum (string), record (struct), array (list),
map (map<string, _>), union of null and one type (that type, nullable), date (date32 / date),
time-millis and time-micros (int64 / long: microseconds since midnight; Spark cannot read a
table with an Iceberg time column at all), timestamp-millis and timestamp-micros
(timestamp[us, UTC] / timestamptz: an Avro timestamp is an instant), local-timestamp-* (timestamp
[us] / timestamp), decimal (decimal128(p, s) / decimal(p, s)), uuid (string, which every
Iceberg engine reads; Iceberg's uuid type is not read by pyarrow-based readers everywhere).
The top-level type is usually a record (its fields become columns); any type does for a
`_kafka_key` or `_kafka_value` column. Named types may be used again by name, also across
references (the referenced schemas are
parsed first, into the same names). A union of two non-null types, a recursive type or a
decimal wider than 38 digits has no Iceberg form: Conflict.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from collections.abc import Hashable
from typing import Any

import fastavro
import pyarrow as pa

from tabletopic.convert import Conflict
from tabletopic.typeconvert import Shape

PRIMITIVES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "bytes": pa.binary(),
    "null": pa.null(),
}
MAX_DEPTH = 64


def avro_to_arrow(s: Any, named: dict[str, Any] | None = None, depth: int = 0
                  ) -> tuple[pa.DataType, bool]:
    """The Arrow type of a (fastavro-parsed) Avro schema and whether it may be null. `named`:
    fastavro's named types (a type used again appears as its name)."""
    if depth > MAX_DEPTH:
        raise Conflict("a recursive (or too deeply nested) type has no Iceberg form")
    if isinstance(s, list):
        branches = [b for b in s if b != "null"]
        if len(branches) != 1:
            raise Conflict(f"a union of {len(branches)} non-null types is not supported")
        return avro_to_arrow(branches[0], named, depth + 1)[0], True
    if isinstance(s, str):
        if s in PRIMITIVES:
            return PRIMITIVES[s], s == "null"
        if named and s in named:
            return avro_to_arrow(named[s], named, depth + 1)
        raise Conflict(f"unsupported Avro type {s!r}")
    t = s.get("type")
    logical = s.get("logicalType")
    if logical == "date" and t == "int":
        return pa.date32(), False
    if logical in ("time-millis", "time-micros"):
        return pa.int64(), False  # micros since midnight (Spark reads no Iceberg time)
    if logical in ("timestamp-millis", "timestamp-micros"):
        return pa.timestamp("us", tz="UTC"), False
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return pa.timestamp("us"), False
    if logical == "decimal":
        precision, scale = int(s["precision"]), int(s.get("scale", 0))
        if precision > 38:
            raise Conflict(f"decimal precision {precision} > 38")
        return pa.decimal128(precision, scale), False
    if logical == "uuid" and t == "string":
        return pa.string(), False
    if t == "record":
        fields = []
        for f in s["fields"]:
            ft, _nullable = avro_to_arrow(f["type"], named, depth + 1)
            fields.append(pa.field(f["name"], ft, nullable=True))
        return pa.struct(fields), False
    if t == "array":
        return pa.list_(avro_to_arrow(s["items"], named, depth + 1)[0]), False
    if t == "map":
        return pa.map_(pa.string(), avro_to_arrow(s["values"], named, depth + 1)[0]), False
    if t == "enum":
        return pa.string(), False
    if t == "fixed":
        return pa.binary(), False
    if isinstance(t, (str, list, dict)):
        return avro_to_arrow(t, named, depth + 1)
    raise Conflict(f"unsupported Avro schema {json.dumps(s)[:100]}")


def _fix(v: Any) -> Any:
    """Python values the columns take differently: uuid.UUID -> its string, a time of day ->
    microseconds since midnight."""
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, dt.time):
        return ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
    if isinstance(v, dict):
        return {k: _fix(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_fix(x) for x in v]
    return v


class AvroWriter:
    """One Avro writer schema (a record)."""

    def __init__(self, text: str, deps: list[tuple[str, str]]) -> None:
        named: dict[str, Any] = {}
        for _name, dep_text in deps:
            fastavro.parse_schema(json.loads(dep_text), named_schemas=named)
        raw = json.loads(text)
        self.parsed = fastavro.parse_schema(raw, named_schemas=named)
        top, _ = avro_to_arrow(self.parsed, named)
        texts = [text, *(t for _, t in deps)]
        self.needs_fix = any(m in t for t in texts for m in ('"uuid"', '"time-mi'))
        self.shape = Shape(top, self._decode)

    def select(self, payload: bytes, framed: bool, message: str = ""
               ) -> tuple[Hashable, Shape, bytes]:
        return None, self.shape, payload

    def _decode(self, body: bytes) -> Any:
        doc = fastavro.schemaless_reader(io.BytesIO(body), self.parsed, None)
        return _fix(doc) if self.needs_fix else doc


def parse_avro(text: str, deps: list[tuple[str, str]]) -> AvroWriter:
    return AvroWriter(text, deps)
