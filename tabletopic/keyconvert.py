"""`table.topic.convert.key.type`: record keys as one typed column, `_kafka_key` (AutoMQ's name
for it), next to the value columns. The key also stays as bytes in `_kafka.key`.

The key is converted like a value by its own converter (tabletopic.convert for raw, string,
json; tabletopic.schemaconvert for by_schema_id / by_latest_schema with subject
`table.topic.convert.key.subject`, default `<topic>-key`): raw -> binary, string -> string,
json -> a struct of the key object's fields, and for the schema types the key's type as the
schema says (an Avro record, JSON Schema object or Protobuf message -> a struct; an Avro
`string` or `long` -> string, long; ...), evolved like the value columns. A null key is a null
`_kafka_key`. A record whose key cannot be converted (not UTF-8, not a JSON object, not in
the wire format, ...) is invalid, its reason starting with "key: ".
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from broker.protocol.recordcodec import Record
from tabletopic.config import TableTopicConfig
from tabletopic.convert import Converter, Invalid
from tabletopic.schemaconvert import SchemaConverter
from tabletopic.transformconvert import TransformedConverter, known_values

KEY_COLUMN = "_kafka_key"
SCHEMA_TYPES = ("by_schema_id", "by_latest_schema")
AnyConverter = Converter | SchemaConverter
ValueConverter = Converter | SchemaConverter | TransformedConverter


def converter(cfg: TableTopicConfig, known: pa.Schema | None = None
              ) -> ValueConverter | KeyedConverter:
    """The converter a table topic's settings ask for; `known`: the table's columns."""
    values_known, key_known = split_known(known) if known is not None else (None, None)
    if values_known is not None:
        values_known = known_values(cfg.transform, values_known)
    base: AnyConverter = (
        SchemaConverter(cfg.value_type, values_known) if cfg.value_type in SCHEMA_TYPES
        else Converter(cfg.value_type, values_known))
    if isinstance(base, SchemaConverter):
        base.message_name = cfg.value_message
    values: ValueConverter = base if cfg.transform == "flatten" else TransformedConverter(
        base, cfg.transform)
    if cfg.key_type == "none":
        return values
    keys: AnyConverter
    if cfg.key_type in SCHEMA_TYPES:  # the key's type, whatever it is, in one column
        whole = pa.schema([pa.field("value", key_known)]) if key_known is not None else None
        keys = SchemaConverter(cfg.key_type, whole, whole=True)
        keys.message_name = cfg.key_message
    else:
        fields = None
        if key_known is not None and pa.types.is_struct(key_known):
            fields = pa.schema(list(key_known))
        keys = Converter(cfg.key_type, fields)
    return KeyedConverter(values, keys)


def schema_parts(conv: ValueConverter | KeyedConverter, records: list[Record],
                 cfg: TableTopicConfig) -> list[tuple[SchemaConverter, list[Record], str]]:
    """The schema converters these records go through, with the records as each sees them
    (keys as values for the key converter) and the subject of its by_latest_schema."""
    values = conv.values if isinstance(conv, KeyedConverter) else conv
    if isinstance(values, TransformedConverter):
        values = values.inner
    out = []
    if isinstance(values, SchemaConverter):
        out.append((values, records, cfg.value_subject))
    if isinstance(conv, KeyedConverter) and isinstance(conv.keys, SchemaConverter):
        out.append((conv.keys, keys_as_values(records), cfg.key_subject))
    return out


def split_known(known: pa.Schema) -> tuple[pa.Schema, pa.DataType | None]:
    """The table's columns without `_kafka_key`, and the type of `_kafka_key` (or None)."""
    keep = [f for f in known if f.name != KEY_COLUMN]
    key = known.field(KEY_COLUMN).type if KEY_COLUMN in known.names else None
    return pa.schema(keep), key


def keys_as_values(records: list[Record]) -> list[Record]:
    return [replace(r, value=r.key) for r in records]


class KeyedConverter:
    """A value converter plus a key converter: the value's columns and `_kafka_key`."""

    def __init__(self, values: ValueConverter, keys: AnyConverter) -> None:
        self.values = values
        self.keys = keys
        self.value_type = values.value_type

    def convert(
        self, partition: int, records: list[Record]
    ) -> tuple[pa.Table | None, list[Invalid]]:
        table, invalid = self.values.convert(partition, records)
        if table is None:
            return None, invalid
        by_offset = {r.offset: r for r in records}
        offsets = table.column("_kafka").combine_chunks().field("offset").to_pylist()
        kept = [by_offset[o] for o in offsets]
        ktable, kinvalid = self.keys.convert(partition, keys_as_values(kept))
        bad_keys = {i.record.offset for i in kinvalid}
        if kinvalid:
            bad = pa.array(sorted(bad_keys), pa.int64())
            mask = pc.invert(pc.is_in(pa.array(offsets, pa.int64()), value_set=bad))
            table = table.filter(mask)
            invalid = sorted(invalid + [Invalid(by_offset[i.record.offset], f"key: {i.reason}")
                                        for i in kinvalid], key=lambda i: i.record.offset)
        if table.num_rows == 0:
            return None, invalid
        if ktable is None:
            return table, invalid
        cols = [c for c in ktable.column_names if c != "_kafka"]
        if self.keys.value_type in ("raw", "string") or isinstance(self.keys, SchemaConverter):
            if "value" not in cols:
                return table, invalid  # only null keys so far: no column
            column = ktable.column("value").combine_chunks()
        elif not cols:
            return table, invalid  # no typed key seen yet: no column
        else:
            arrays = [ktable.column(c).combine_chunks() for c in cols]
            # a null key (the key converter's tombstone) is a null struct, not one of nulls
            valid = pa.array([r.key is not None for r in kept if r.offset not in bad_keys])
            column = pa.StructArray.from_arrays(arrays, names=cols, mask=pc.invert(valid))
        return table.append_column(pa.field(KEY_COLUMN, column.type), column), invalid

    def schema(self) -> pa.Schema:
        return self.values.schema()
