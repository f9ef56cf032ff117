"""Records to Arrow: the `_kafka` struct plus value columns (raw bytes, a string, or JSON
objects whose top-level fields become columns with inferred, evolving types).

JSON typing: booleans -> boolean, integers -> long, other numbers -> double, strings -> string,
objects -> struct, arrays -> list. A field seen for the first time adds a column (or a nested
field); an integer where a double column exists is widened; any other mismatch (a string where
a long column exists, ...) makes that record invalid: it goes to the dead-letter topic, the
others go on. Null, [] and {} carry no type: they never create a column on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa

from broker.protocol.recordcodec import Record

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
KAFKA_TYPE = pa.struct(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("headers", pa.list_(HEADER_TYPE)),
    ]
)
KAFKA_FIELD = pa.field("_kafka", KAFKA_TYPE, nullable=False)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Conflict(ValueError):
    pass


@dataclass(frozen=True)
class Invalid:
    record: Record
    reason: str


def infer(v: Any) -> pa.DataType | None:
    """The Arrow type of one JSON value (None: no type information)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return pa.bool_()
    if isinstance(v, int):
        if not INT64_MIN <= v <= INT64_MAX:
            raise Conflict(f"integer {v} does not fit a long")
        return pa.int64()
    if isinstance(v, float):
        return pa.float64()
    if isinstance(v, str):
        return pa.string()
    if isinstance(v, list):
        elem: pa.DataType | None = None
        for item in v:
            elem = unify(elem, infer(item))
        return None if elem is None else pa.list_(elem)
    if isinstance(v, dict):
        fields: dict[str, pa.DataType] = {}
        for k, item in v.items():
            t = infer(item)
            if t is not None:
                fields[k] = t
        return pa.struct([pa.field(k, t) for k, t in fields.items()]) if fields else None
    raise Conflict(f"unsupported JSON value {type(v).__name__}")


def unify(known: pa.DataType | None, new: pa.DataType | None) -> pa.DataType | None:
    """The type that holds both, or Conflict."""
    if new is None or known == new:
        return known
    if known is None:
        return new
    if pa.types.is_float64(known) and pa.types.is_int64(new):
        return known
    if pa.types.is_struct(known) and pa.types.is_struct(new):
        fields = {f.name: f.type for f in known}
        for f in new:
            fields[f.name] = unify(fields.get(f.name), f.type)
        return pa.struct([pa.field(k, t) for k, t in fields.items()])
    if pa.types.is_list(known) and pa.types.is_list(new):
        return pa.list_(unify(known.value_type, new.value_type))
    raise Conflict(f"{new} where the column is {known}")


def kafka_column(partition: int, records: list[Record]) -> pa.StructArray:
    """The `_kafka` struct column, built from flat child arrays (no per-record dicts)."""
    n = len(records)
    header_offsets = [0]
    header_keys: list[str] = []
    header_values: list[bytes | None] = []
    for r in records:
        for k, v in r.headers:
            header_keys.append(k)
            header_values.append(v)
        header_offsets.append(len(header_keys))
    headers = pa.ListArray.from_arrays(
        pa.array(header_offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(header_keys, pa.string()), pa.array(header_values, pa.binary())],
            fields=list(HEADER_TYPE),
        ),
    )
    return pa.StructArray.from_arrays(
        [
            pa.array([partition] * n, pa.int32()),
            pa.array([r.offset for r in records], pa.int64()),
            pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
            pa.array([r.key for r in records], pa.binary()),
            headers,
        ],
        fields=list(KAFKA_TYPE),
    )


def plain(t: pa.DataType) -> pa.DataType:
    """Arrow types as this module builds them (a table's schema read back through pyiceberg
    may use large_string / large_binary / large_list)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(plain(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, plain(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(plain(t.key_type), plain(t.item_type))
    if pa.types.is_timestamp(t) and t.unit == "us":
        return pa.timestamp("us", tz=t.tz)
    return t


def normalize(t: pa.DataType) -> pa.DataType | None:
    """Drop what carries no type (null columns, empty structs and lists of nulls)."""
    if pa.types.is_null(t):
        return None
    if pa.types.is_struct(t):
        fields = [(f.name, normalize(f.type)) for f in t]
        kept = [pa.field(n, ft) for n, ft in fields if ft is not None]
        return pa.struct(kept) if kept else None
    if pa.types.is_list(t):
        elem = normalize(t.value_type)
        return None if elem is None else pa.list_(elem)
    return t


class Converter:
    def __init__(self, value_type: str, known: pa.Schema | None = None) -> None:
        self.value_type = value_type
        self.fields: dict[str, pa.DataType] = {}
        if value_type == "json" and known is not None:
            self.fields = {f.name: plain(f.type) for f in known if f.name != "_kafka"}

    def schema(self) -> pa.Schema:
        if self.value_type == "raw":
            return pa.schema([KAFKA_FIELD, pa.field("value", pa.binary())])
        if self.value_type == "string":
            return pa.schema([KAFKA_FIELD, pa.field("value", pa.string())])
        return pa.schema([KAFKA_FIELD, *(pa.field(k, t) for k, t in self.fields.items())])

    def convert(
        self, partition: int, records: list[Record]
    ) -> tuple[pa.Table | None, list[Invalid]]:
        """The valid records as one Arrow table (None if there are none) and the invalid ones."""
        invalid: list[Invalid] = []
        if self.value_type == "raw":
            good = records
            columns: dict[str, list[Any]] = {"value": [r.value for r in records]}
        elif self.value_type == "string":
            good, values = [], []
            for r in records:
                try:
                    values.append(None if r.value is None else r.value.decode("utf-8"))
                    good.append(r)
                except UnicodeDecodeError as e:
                    invalid.append(Invalid(r, f"value is not UTF-8: {e}"))
            columns = {"value": values}
        else:
            good, rows = self._json_rows(records, invalid)
            columns = {k: [row.get(k) for row in rows] for k in self.fields}
        if not good:
            return None, invalid
        kafka = kafka_column(partition, good)
        schema = self.schema()
        arrays = [kafka] + [pa.array(columns[f.name], type=f.type) for f in list(schema)[1:]]
        return pa.Table.from_arrays(arrays, schema=schema), invalid

    def _json_rows(
        self, records: list[Record], invalid: list[Invalid]
    ) -> tuple[list[Record], list[dict[str, Any]]]:
        """Fast path: decode every value, let Arrow infer the whole batch's types in C++ and
        unify them with the known columns once. If that fails (types clash inside the batch
        or with the table), fall back to checking record by record."""
        decoder = msgspec.json.Decoder()
        good: list[Record] = []
        rows: list[dict[str, Any]] = []
        for r in records:
            if r.value is None:
                good.append(r)
                rows.append({})
                continue
            try:
                doc = decoder.decode(r.value)
            except msgspec.DecodeError as e:
                invalid.append(Invalid(r, f"invalid JSON record: {e}"))
                continue
            if not isinstance(doc, dict) or "_kafka" in doc:
                invalid.clear()
                return self._json_rows_slow(records, invalid)  # it says why, record by record
            good.append(r)
            rows.append(doc)
        try:
            batch_type = normalize(pa.array(rows).type) if rows else None
            fields = dict(self.fields)
            for f in batch_type or ():
                fields[f.name] = unify(fields.get(f.name), f.type)
        except (pa.ArrowException, Conflict, OverflowError):
            invalid.clear()
            return self._json_rows_slow(records, invalid)
        self.fields = {k: t for k, t in fields.items() if t is not None}
        return good, rows

    def _json_rows_slow(
        self, records: list[Record], invalid: list[Invalid]
    ) -> tuple[list[Record], list[dict[str, Any]]]:
        decoder = msgspec.json.Decoder()
        good: list[Record] = []
        rows: list[dict[str, Any]] = []
        for r in records:
            if r.value is None:  # a tombstone: a row with no value columns
                good.append(r)
                rows.append({})
                continue
            try:
                doc = decoder.decode(r.value)
                if not isinstance(doc, dict):
                    raise Conflict(f"a JSON {type(doc).__name__}, not an object")
                if "_kafka" in doc:
                    raise Conflict("the field name _kafka is reserved")
                changes = {}
                for k, v in doc.items():
                    t = unify(self.fields.get(k), infer(v))
                    if t is not None and t != self.fields.get(k):
                        changes[k] = t
            except (msgspec.DecodeError, Conflict) as e:
                invalid.append(Invalid(r, f"invalid JSON record: {e}"))
                continue
            self.fields.update(changes)
            good.append(r)
            rows.append(doc)
        return good, rows
