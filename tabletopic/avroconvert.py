"""`table.topic.convert.value.type=by_schema_id`: Confluent wire-format Avro values to typed
Arrow columns.

A value is `0x00`, a 4-byte big-endian schema id, then the Avro binary encoding with that
(writer) schema. The writer fetches unknown ids from the Schema Registry (`SchemaById`, given by
the composition root) and hands them to `AvroConverter.add_schema`; records are decoded with
fastavro's schemaless_reader. Columns are the top-level fields of the record schemas seen so
far (their union, all nullable: a field absent from one version is null in its rows).

Avro -> Arrow (-> Iceberg): boolean, int (int32 / int), long (int64 / long), float (float32 /
float), double, string, bytes and fixed (binary), enum (string), record (struct), array (list),
map (map<string, _>), union of null and one type (that type, nullable), date (date32 / date),
time-millis and time-micros (time64[us] / time), timestamp-millis and timestamp-micros
(timestamp[us, UTC] / timestamptz: an Avro timestamp is an instant), local-timestamp-* (timestamp
[us] / timestamp), decimal (decimal128(p, s) / decimal(p, s)), uuid (string, which every
Iceberg engine reads; Iceberg's uuid type is not read by pyarrow-based readers everywhere).

Evolution across writer schemas: new fields add columns, int -> long and float -> double widen
the column (Iceberg's promotions). A change Iceberg cannot express (string -> int, decimal
precision, a union of two non-null types, ...) makes that schema id's records invalid with the
reason: they follow errors.tolerance like any invalid record.
"""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import fastavro
import pyarrow as pa
from fastavro.schema import SchemaParseException

from broker.protocol.recordcodec import Record
from tabletopic.convert import KAFKA_FIELD, Conflict, Invalid, kafka_column, plain


class StoredSchemaLike(Protocol):
    """What the writer needs of a registry schema."""

    @property
    def schema_type(self) -> str: ...
    @property
    def schema(self) -> str: ...
    @property
    def references(self) -> tuple[Any, ...]: ...


class SchemaById(Protocol):
    """The Schema Registry as the table writer sees it (broker.schemaregistry.SchemaRegistry).
    `get_by_id` raises an exception with `code == 40403` when no subject holds the id."""

    async def get_by_id(self, schema_id: int) -> StoredSchemaLike: ...


@dataclass
class WriterSchema:
    parsed: Any  # fastavro's parsed schema, or None when `error` says why it cannot be used
    fields: dict[str, pa.DataType]
    error: str | None = None
    has_uuid: bool = False


def avro_to_arrow(s: Any) -> tuple[pa.DataType, bool]:
    """The Arrow type of a (fastavro-parsed) Avro schema and whether it may be null."""
    if isinstance(s, list):
        branches = [b for b in s if b != "null"]
        if len(branches) != 1:
            raise Conflict(f"a union of {len(branches)} non-null types is not supported")
        return avro_to_arrow(branches[0])[0], True
    if isinstance(s, str):
        prim = {
            "boolean": pa.bool_(),
            "int": pa.int32(),
            "long": pa.int64(),
            "float": pa.float32(),
            "double": pa.float64(),
            "string": pa.string(),
            "bytes": pa.binary(),
            "null": pa.null(),
        }
        if s not in prim:
            raise Conflict(f"unsupported Avro type {s!r}")
        return prim[s], s == "null"
    t = s.get("type")
    logical = s.get("logicalType")
    if logical == "date" and t == "int":
        return pa.date32(), False
    if logical in ("time-millis", "time-micros"):
        return pa.time64("us"), False
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
            ft, _nullable = avro_to_arrow(f["type"])
            fields.append(pa.field(f["name"], ft, nullable=True))
        return pa.struct(fields), False
    if t == "array":
        return pa.list_(avro_to_arrow(s["items"])[0]), False
    if t == "map":
        return pa.map_(pa.string(), avro_to_arrow(s["values"])[0]), False
    if t == "enum":
        return pa.string(), False
    if t == "fixed":
        return pa.binary(), False
    if isinstance(t, (str, list, dict)):
        return avro_to_arrow(t)
    raise Conflict(f"unsupported Avro schema {json.dumps(s)[:100]}")


def widen(known: pa.DataType | None, new: pa.DataType) -> pa.DataType:
    """The column type holding both (Iceberg's promotions int -> long, float -> double), or
    Conflict."""
    if known is None or known == new:
        return new
    if pa.types.is_null(new):
        return known
    if pa.types.is_null(known):
        return new
    if pa.types.is_int64(known) and pa.types.is_int32(new):
        return known
    if pa.types.is_int32(known) and pa.types.is_int64(new):
        return new
    if pa.types.is_float64(known) and pa.types.is_float32(new):
        return known
    if pa.types.is_float32(known) and pa.types.is_float64(new):
        return new
    if pa.types.is_struct(known) and pa.types.is_struct(new):
        fields: dict[str, pa.DataType] = {f.name: f.type for f in known}
        for f in new:
            fields[f.name] = widen(fields.get(f.name), f.type)
        return pa.struct([pa.field(k, t) for k, t in fields.items()])
    if pa.types.is_list(known) and pa.types.is_list(new):
        return pa.list_(widen(known.value_type, new.value_type))
    if pa.types.is_map(known) and pa.types.is_map(new):
        return pa.map_(pa.string(), widen(known.item_type, new.item_type))
    raise Conflict(f"{new} where the column is {known} (Iceberg cannot change it)")


def _has_uuid(s: Any) -> bool:
    text = json.dumps(s)
    return '"uuid"' in text


def _fix(v: Any) -> Any:
    """Python values Arrow does not take: uuid.UUID -> its string."""
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, dict):
        return {k: _fix(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_fix(x) for x in v]
    return v


def _map_pairs(v: Any, t: pa.DataType) -> Any:
    """fastavro decodes maps to dicts; Arrow's map type takes lists of (key, value)."""
    if v is None:
        return None
    if pa.types.is_map(t):
        return [(k, _map_pairs(x, t.item_type)) for k, x in v.items()]
    if pa.types.is_struct(t):
        return {f.name: _map_pairs(v.get(f.name), f.type) for f in t}
    if pa.types.is_list(t):
        return [_map_pairs(x, t.value_type) for x in v]
    return v


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(f.type) for f in t)
    if pa.types.is_list(t):
        return _has_map(t.value_type)
    return False


class AvroConverter:
    """Converts Confluent wire-format Avro records (see the module docstring)."""

    value_type = "by_schema_id"

    def __init__(self, known: pa.Schema | None = None) -> None:
        self.fields: dict[str, pa.DataType] = {}
        if known is not None:
            self.fields = {f.name: plain(f.type) for f in known if f.name != "_kafka"}
        self.schemas: dict[int, WriterSchema] = {}

    @staticmethod
    def schema_id(value: bytes | None) -> int | None:
        """The schema id of a wire-format value (None: not the wire format)."""
        if value is None or len(value) < 5 or value[0] != 0:
            return None
        return int.from_bytes(value[1:5], "big")

    def missing_ids(self, records: list[Record]) -> set[int]:
        """Schema ids of these records not fetched yet."""
        ids = {self.schema_id(r.value) for r in records}
        return {i for i in ids if i is not None and i not in self.schemas}

    def add_schema(self, schema_id: int, schema_type: str, text: str, refs: int = 0) -> None:
        """Learn a writer schema (schema_type as the registry says: AVRO, JSON, PROTOBUF)."""
        try:
            if schema_type.upper() != "AVRO":
                raise Conflict(f"schema {schema_id} is {schema_type}: only Avro is converted")
            if refs:
                raise Conflict(f"schema {schema_id} has references: not supported")
            raw = json.loads(text)
            parsed = fastavro.parse_schema(raw)
            top, _ = avro_to_arrow(parsed)
            if not pa.types.is_struct(top):
                raise Conflict(f"schema {schema_id} is not a record")
            fields = {f.name: f.type for f in top}
            if "_kafka" in fields:
                raise Conflict("the field name _kafka is reserved")
            self.schemas[schema_id] = WriterSchema(parsed, fields, None, _has_uuid(raw))
        except (Conflict, ValueError, KeyError, TypeError, SchemaParseException) as e:
            self.schemas[schema_id] = WriterSchema(None, {}, f"schema id {schema_id}: {e}")

    def add_unknown(self, schema_id: int, reason: str) -> None:
        self.schemas[schema_id] = WriterSchema(None, {}, f"schema id {schema_id}: {reason}")

    def schema(self) -> pa.Schema:
        return pa.schema([KAFKA_FIELD, *(pa.field(k, t) for k, t in self.fields.items())])

    def _merge(self, ws: WriterSchema) -> str | None:
        """Widen the columns for this writer schema; the reason if Iceberg cannot."""
        try:
            merged = dict(self.fields)
            for k, t in ws.fields.items():
                merged[k] = widen(merged.get(k), t)
        except Conflict as e:
            return f"field change Iceberg cannot express: {e}"
        self.fields = {k: t for k, t in merged.items() if not pa.types.is_null(t)}
        return None

    def convert(
        self, partition: int, records: list[Record]
    ) -> tuple[pa.Table | None, list[Invalid]]:
        """The valid records as one Arrow table (None if there are none) and the invalid ones.
        Every id of these records must have been given (add_schema / add_unknown)."""
        invalid: list[Invalid] = []
        good: list[Record] = []
        rows: list[dict[str, Any]] = []
        merged: dict[int, str | None] = {}
        for r in records:
            if r.value is None:  # a tombstone: a row with no value columns
                good.append(r)
                rows.append({})
                continue
            sid = self.schema_id(r.value)
            if sid is None:
                invalid.append(Invalid(r, "not the Confluent wire format (magic byte 0, id)"))
                continue
            ws = self.schemas[sid]
            if ws.error is not None:
                invalid.append(Invalid(r, ws.error))
                continue
            if sid not in merged:
                merged[sid] = self._merge(ws)
            if merged[sid] is not None:
                invalid.append(Invalid(r, f"schema id {sid}: {merged[sid]}"))
                continue
            try:
                doc = fastavro.schemaless_reader(io.BytesIO(r.value[5:]), ws.parsed, None)
            except Exception as e:  # fastavro raises many types on truncated / bad data
                invalid.append(Invalid(r, f"invalid Avro for schema id {sid}: {e!r}"))
                continue
            if not isinstance(doc, dict):
                invalid.append(Invalid(r, f"schema id {sid}: not a record"))
                continue
            good.append(r)
            rows.append(_fix(doc) if ws.has_uuid else doc)
        if not good:
            return None, invalid
        schema = self.schema()
        arrays: list[pa.Array] = [kafka_column(partition, good)]
        for f in list(schema)[1:]:
            values = [row.get(f.name) for row in rows]
            if _has_map(f.type):
                values = [_map_pairs(v, f.type) for v in values]
            arrays.append(pa.array(values, type=f.type))
        return pa.Table.from_arrays(arrays, schema=schema), invalid
