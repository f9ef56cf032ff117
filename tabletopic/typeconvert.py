"""What the schema-driven converters (Avro, JSON Schema, Protobuf) share: a `Shape` (the
columns one writer schema gives and how to decode a payload into a row of them) and `widen`,
the column type holding an old and a new writer type (Iceberg's promotions, nothing else).

Rows are plain Python values Arrow takes for the column types: dicts for structs and maps,
lists, datetime/date/time, Decimal. Every column and nested field is nullable: a field absent
from one writer version is null in its rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tabletopic.convert import Conflict

# Column names the converters add themselves: a value field may not take them.
RESERVED = ("_kafka", "_kafka_key", "_kafka_value", "_cdc")


@dataclass(frozen=True)
class Shape:
    """One writer type: the Arrow type of its values (a struct for records, objects and
    messages) and `decode(payload) -> value` (a dict for a struct), which raises (any
    exception) on bad data."""

    type: pa.DataType
    decode: Callable[[bytes], Any]


def struct_fields(t: pa.DataType, what: str) -> dict[str, pa.DataType]:
    """The columns of a writer's top-level type, which must be a struct (a record, an object,
    a message)."""
    if not pa.types.is_struct(t):
        raise Conflict(f"{what} is not a record: its values cannot become columns")
    fields = {f.name: f.type for f in t}
    taken = [k for k in fields if k in RESERVED]
    if taken:
        raise Conflict(f"the field name {taken[0]} is reserved")
    return fields


def widen(known: pa.DataType | None, new: pa.DataType) -> pa.DataType:
    """The column type holding both (Iceberg's promotions int -> long, float -> double,
    decimal(P, S) -> decimal(P', S) with P' > P), or Conflict."""
    if known is None or known == new:
        return new
    if pa.types.is_null(new):
        return known
    if pa.types.is_null(known):
        return new
    for narrow, wide in ((pa.int32(), pa.int64()), (pa.float32(), pa.float64())):
        if {known, new} == {narrow, wide}:
            return wide
    if pa.types.is_decimal(known) and pa.types.is_decimal(new) and known.scale == new.scale:
        return known if known.precision >= new.precision else new
    if pa.types.is_struct(known) and pa.types.is_struct(new):
        fields: dict[str, pa.DataType] = {f.name: f.type for f in known}
        for f in new:
            fields[f.name] = widen(fields.get(f.name), f.type)
        return pa.struct([pa.field(k, t) for k, t in fields.items()])
    if pa.types.is_list(known) and pa.types.is_list(new):
        return pa.list_(widen(known.value_type, new.value_type))
    if pa.types.is_map(known) and pa.types.is_map(new):
        if known.key_type != new.key_type:
            raise Conflict(f"map keys {new.key_type} where the column has {known.key_type}")
        return pa.map_(known.key_type, widen(known.item_type, new.item_type))
    raise Conflict(f"{new} where the column is {known} (Iceberg cannot change it)")


def merge(known: dict[str, pa.DataType], new: dict[str, pa.DataType]
          ) -> dict[str, pa.DataType]:
    """The columns after a writer with `new` columns (Conflict if Iceberg cannot hold both)."""
    merged = dict(known)
    for k, t in new.items():
        merged[k] = widen(merged.get(k), t)
    return {k: t for k, t in merged.items() if not pa.types.is_null(t)}
