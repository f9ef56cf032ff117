"""`table.topic.convert.value.type` = `by_schema_id` / `by_latest_schema`: values written with a
registered schema (Avro, JSON Schema, Protobuf) to typed Arrow columns.

by_schema_id: a value is Confluent's wire format, `0x00`, a 4-byte big-endian schema id, then
(Protobuf only) the message indexes, then the payload. by_latest_schema: a value is the bare
payload, read with the latest version of `table.topic.convert.value.subject` (the writer
re-reads which version that is before each pass over the partitions). The writer fetches the
schemas of ids it has not seen from the Schema Registry (`SchemaById`, given by the composition
root) and hands them to `add_schema`, dispatched by the registered schema type to
tabletopic.avroconvert, .jsonschemaconvert or .protoconvert; each gives a `Shape` per writer
type (tabletopic.typeconvert).

Columns are the union of the writer types seen (tabletopic.typeconvert.merge: new fields add
columns, int -> long, float -> double and decimal precision widen them), evolved by the writer
in the commit that carries the rows. A schema that cannot be used (unparseable, a type without
an Iceberg form) or a change Iceberg cannot express makes that writer's records invalid with
the reason; so do a value not in the wire format, an unknown id, and undecodable bytes: they
follow errors.tolerance like any invalid record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol

import pyarrow as pa

from broker.protocol.recordcodec import Record
from tabletopic.avroconvert import parse_avro
from tabletopic.convert import KAFKA_FIELD, Conflict, Invalid, kafka_column, plain
from tabletopic.jsonschemaconvert import parse_json_schema
from tabletopic.protoconvert import parse_proto
from tabletopic.typeconvert import Shape, merge, struct_fields


class WriterSchema(Protocol):
    def select(self, payload: bytes, framed: bool, message: str = ""
               ) -> tuple[Hashable, Shape, bytes]:
        """The writer type of this payload (a key naming it, its shape) and the bytes left to
        decode; `framed`: the payload follows a wire-format id (Protobuf message indexes);
        `message`: the Protobuf message type of bare payloads (default: the first)."""
        ...


class ReferenceLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def version(self) -> int: ...


class StoredSchemaLike(Protocol):
    """What the writer needs of a registry schema."""

    @property
    def id(self) -> int: ...
    @property
    def schema_type(self) -> str: ...
    @property
    def schema(self) -> str: ...
    @property
    def references(self) -> tuple[Any, ...]: ...


class SubjectVersionLike(Protocol):
    @property
    def schema(self) -> StoredSchemaLike: ...


class SchemaById(Protocol):
    """The Schema Registry as the table writer sees it (broker.schemaregistry.SchemaRegistry).
    Both raise an exception with `code` 40403 (no such id) / 40401, 40402 (no such subject,
    version) for what the registry does not hold."""

    async def get_by_id(self, schema_id: int) -> StoredSchemaLike: ...
    async def get_version(self, subject: str, version: str) -> SubjectVersionLike: ...


PARSERS: dict[str, Callable[[str, list[tuple[str, str]]], WriterSchema]] = {
    "AVRO": parse_avro, "JSON": parse_json_schema, "PROTOBUF": parse_proto}
WIRE = "not the Confluent wire format (magic byte 0, 4-byte schema id)"
RECHECK_UNKNOWN_S = 30.0


class SchemaConverter:
    """Converts values written with registered schemas (see the module docstring)."""

    def __init__(self, value_type: str = "by_schema_id", known: pa.Schema | None = None,
                 whole: bool = False) -> None:
        """whole: values of any type in one column `value` (keys); else the fields of
        record values are the columns."""
        self.value_type = value_type
        self.whole = whole
        self.fields: dict[str, pa.DataType] = {}
        if known is not None:
            self.fields = {f.name: plain(f.type) for f in known if f.name != "_kafka"}
        self.schemas: dict[int, WriterSchema | str] = {}  # a str says why it is unusable
        self.latest: int | None = None  # by_latest_schema: the id to read values with
        self.message_name = ""  # by_latest_schema Protobuf: the message type (default first)
        self.latest_error = "no schema for the subject yet"
        self._merged: dict[tuple[int, Hashable], str | None] = {}
        self._unknown: dict[int, float] = {}  # id -> when the registry did not have it

    @property
    def framed(self) -> bool:
        return self.value_type == "by_schema_id"

    @staticmethod
    def schema_id(value: bytes | None) -> int | None:
        """The schema id of a wire-format value (None: not the wire format)."""
        if value is None or len(value) < 5 or value[0] != 0:
            return None
        return int.from_bytes(value[1:5], "big")

    def missing_ids(self, records: list[Record]) -> set[int]:
        """Schema ids of these records not given yet (by_schema_id), and ids the registry did
        not hold (add_unknown) more than RECHECK_UNKNOWN_S ago: asked again."""
        if not self.framed:
            return set()
        ids = {self.schema_id(r.value) for r in records}
        now = time.monotonic()
        return {i for i in ids if i is not None and (
            i not in self.schemas or now - self._unknown.get(i, now) > RECHECK_UNKNOWN_S)}

    def add_schema(self, schema_id: int, schema_type: str, text: str,
                   deps: list[tuple[str, str]] | None = None) -> None:
        """Learn a writer schema: its type as the registry says (AVRO, JSON, PROTOBUF), text,
        and (reference name, text) of the schemas it references, dependencies first."""
        parser = PARSERS.get(schema_type.upper())
        try:
            if parser is None:
                raise Conflict(f"unknown schema type {schema_type}")
            self.schemas[schema_id] = parser(text, deps or [])
        except Exception as e:  # parsers raise what their libraries raise: the reason goes on
            why = str(e) if isinstance(e, Conflict) else f"{type(e).__name__}: {e}"
            self.schemas[schema_id] = f"schema id {schema_id}: {why}"
        self._unknown.pop(schema_id, None)

    def add_unknown(self, schema_id: int, reason: str) -> None:
        """An id the registry does not hold (or no registry): its records are invalid, and
        the id is asked for again after RECHECK_UNKNOWN_S (another registry may have been
        behind)."""
        self.schemas[schema_id] = f"schema id {schema_id}: {reason}"
        self._unknown[schema_id] = time.monotonic()

    def schema(self) -> pa.Schema:
        return pa.schema([KAFKA_FIELD, *(pa.field(k, t) for k, t in self.fields.items())])

    def _shape(self, value: bytes) -> tuple[int, Shape, bytes]:
        """The writer shape of a value and the bytes to decode; Conflict says why not."""
        if self.framed:
            sid = self.schema_id(value)
            if sid is None:
                raise Conflict(WIRE)
            payload = value[5:]
        else:
            sid, payload = self.latest, value
            if sid is None:
                raise Conflict(f"by_latest_schema: {self.latest_error}")
        ws = self.schemas[sid]
        if isinstance(ws, str):
            raise Conflict(ws)
        try:
            key, shape, body = ws.select(payload, self.framed, self.message_name)
        except Conflict as e:
            raise Conflict(f"schema id {sid}: {e}") from None
        if (sid, key) not in self._merged:
            self._merged[sid, key] = self._merge(shape)
        reason = self._merged[sid, key]
        if reason is not None:
            raise Conflict(f"schema id {sid}: {reason}")
        return sid, shape, body

    def _merge(self, shape: Shape) -> str | None:
        """Widen the columns for this writer type; the reason if Iceberg cannot."""
        try:
            fields = {"value": shape.type} if self.whole else struct_fields(
                shape.type, "the schema")
        except Conflict as e:
            return str(e)
        try:
            self.fields = merge(self.fields, fields)
        except Conflict as e:
            return f"field change Iceberg cannot express: {e}"
        return None

    def convert(
        self, partition: int, records: list[Record]
    ) -> tuple[pa.Table | None, list[Invalid]]:
        """The valid records as one Arrow table (None if there are none) and the invalid ones.
        Every id of these records must have been given (add_schema / add_unknown)."""
        invalid: list[Invalid] = []
        good: list[Record] = []
        rows: list[dict[str, Any]] = []
        for r in records:
            if r.value is None:  # a tombstone: a row with no value columns
                good.append(r)
                rows.append({})
                continue
            try:
                sid, shape, body = self._shape(r.value)
            except Conflict as e:
                invalid.append(Invalid(r, str(e)))
                continue
            try:
                row = shape.decode(body)
                if self.whole:
                    row = {"value": row}
                elif not isinstance(row, dict):
                    raise ValueError("not a record")
                rows.append(row)
            except Exception as e:  # decoders raise many types on truncated / bad data
                invalid.append(Invalid(
                    r, f"schema id {sid}: cannot decode the value: {type(e).__name__}: {e}"))
                continue
            good.append(r)
        schema = self.schema()
        try:
            return self._table(partition, schema, good, rows), invalid
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            pass  # a row Arrow does not take: find it, the others go on
        ok_good, ok_rows = [], []
        for r, row in zip(good, rows, strict=True):
            try:
                self._table(partition, schema, [r], [row])
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
                invalid.append(Invalid(r, f"value does not fit its columns: {e}"))
                continue
            ok_good.append(r)
            ok_rows.append(row)
        invalid.sort(key=lambda i: i.record.offset)
        return self._table(partition, schema, ok_good, ok_rows), invalid

    @staticmethod
    def _table(partition: int, schema: pa.Schema, good: list[Record],
               rows: list[dict[str, Any]]) -> pa.Table | None:
        if not good:
            return None
        arrays: list[pa.Array] = [kafka_column(partition, good)]
        for f in list(schema)[1:]:
            arrays.append(pa.array([row.get(f.name) for row in rows], type=f.type))
        return pa.Table.from_arrays(arrays, schema=schema)
