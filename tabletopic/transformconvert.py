"""`table.topic.transform.value.type`: how converted values become columns (AutoMQ's
transforms).

- `flatten` (floe's default, what floe always did): the value's fields are the top-level
  columns (raw and string values: one `value` column).
- `none`: the whole value is one column, `_kafka_value` (AutoMQ's name): binary (raw), string,
  or a struct of the value's fields (json and the schema types); a null value is a null
  `_kafka_value`.
- `flatten_debezium`: values are Debezium change events (`op`, `before`, `after`, `source`,
  `ts_ms`); the row is `after` for c (create), r (snapshot read) and u (update), `before` for
  d (delete), its fields the top-level columns, plus a `_cdc` struct: op (I for c/r and unknown
  ops, U, D), ts (the event's ts_ms), offset (the record's), source (`schema.table`, else
  `db.table`, from `source`). A value that is not such an event (no `op`, no `before`/`after`,
  an update without `after`, a delete without `before`, a null value such as Debezium's
  tombstone after a delete) is an invalid record.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from broker.protocol.recordcodec import Record
from tabletopic.convert import Conflict, Converter, Invalid
from tabletopic.schemaconvert import SchemaConverter
from tabletopic.typeconvert import widen

VALUE_COLUMN = "_kafka_value"
CDC_COLUMN = "_cdc"
CDC_TYPE = pa.struct([pa.field("op", pa.string()), pa.field("ts", pa.int64()),
                      pa.field("offset", pa.int64()), pa.field("source", pa.string())])
OPS = {"u": "U", "d": "D"}


def known_values(transform: str, known: pa.Schema) -> pa.Schema:
    """The columns the value converter itself made, from the table's (restart)."""
    data = [f for f in known if f.name not in ("_kafka", CDC_COLUMN)]
    if transform == "none":
        value = next((f.type for f in data if f.name == VALUE_COLUMN), None)
        return pa.schema(list(value) if value is not None and pa.types.is_struct(value) else [])
    if transform == "flatten_debezium":
        row = pa.struct(data)
        return pa.schema([pa.field("before", row), pa.field("after", row)]) if data \
            else pa.schema([])
    return pa.schema(data)


class TransformedConverter:
    """A value converter followed by a transform (see the module docstring)."""

    def __init__(self, inner: Converter | SchemaConverter, transform: str) -> None:
        self.inner = inner
        self.transform = transform
        self.value_type = inner.value_type

    def schema(self) -> pa.Schema:
        """The columns known before any record (a new table's)."""
        kafka = self.inner.schema().field("_kafka")
        if self.transform == "none" and self.value_type in ("raw", "string"):
            value = self.inner.schema().field("value").type
            return pa.schema([kafka, pa.field(VALUE_COLUMN, value)])
        return pa.schema([kafka])

    def convert(
        self, partition: int, records: list[Record]
    ) -> tuple[pa.Table | None, list[Invalid]]:
        table, invalid = self.inner.convert(partition, records)
        if table is None:
            return None, invalid
        kafka = table.column("_kafka").combine_chunks()
        by_offset = {r.offset: r for r in records}
        kept = [by_offset[o] for o in kafka.field("offset").to_pylist()]
        if self.transform == "none":
            return self._whole(table, kept), invalid
        out, bad = self._debezium(table, kept)
        invalid = sorted(invalid + bad, key=lambda i: i.record.offset)
        return out, invalid

    def _whole(self, table: pa.Table, kept: list[Record]) -> pa.Table:
        cols = [c for c in table.column_names if c != "_kafka"]
        if self.value_type in ("raw", "string"):
            column = table.column("value").combine_chunks()
        elif not cols:
            return table
        else:
            null = pa.array([r.value is None for r in kept])
            column = pa.StructArray.from_arrays(
                [table.column(c).combine_chunks() for c in cols], names=cols, mask=null)
        return pa.Table.from_arrays([table.column("_kafka"), column],
                                    names=["_kafka", VALUE_COLUMN])

    def _debezium(self, table: pa.Table, kept: list[Record]
                  ) -> tuple[pa.Table | None, list[Invalid]]:
        names = set(table.column_names)
        if "op" not in names or not names & {"before", "after"}:
            return None, [Invalid(r, "not a Debezium change event (no op and before/after)")
                          for r in kept]
        n = table.num_rows
        op = table.column("op").combine_chunks().to_pylist()
        has = {side: (table.column(side).combine_chunks().is_valid().to_pylist()
                      if side in names else [False] * n) for side in ("before", "after")}
        use_after: list[bool] = []
        good: list[int] = []
        bad: list[Invalid] = []
        for i, r in enumerate(kept):
            side = "before" if op[i] == "d" else "after"
            if r.value is None or op[i] is None or not has[side][i]:
                why = ("a null value" if r.value is None else "no op" if op[i] is None
                       else f"op {op[i]!r} without {side!r}")
                bad.append(Invalid(r, f"not a Debezium change event: {why}"))
                continue
            good.append(i)
            use_after.append(side == "after")
        if not good:
            return None, bad
        t = table.take(pa.array(good, pa.int64()))
        try:
            columns = self._row_columns(t, pa.array(use_after))
        except (Conflict, pa.ArrowException) as e:
            return None, bad + [Invalid(kept[i], f"before and after differ: {e}") for i in good]
        kafka = t.column("_kafka").combine_chunks()
        columns[CDC_COLUMN] = self._cdc(t, kafka, [op[i] for i in good])
        return pa.Table.from_arrays([kafka, *columns.values()],
                                    names=["_kafka", *columns]), bad

    @staticmethod
    def _row_columns(t: pa.Table, use_after: pa.Array) -> dict[str, pa.Array]:
        sides = {s: t.column(s).combine_chunks() for s in ("before", "after")
                 if s in t.column_names and pa.types.is_struct(t.column(s).type)}
        types: dict[str, pa.DataType] = {}
        for arr in sides.values():
            for f in arr.type:
                types[f.name] = widen(types.get(f.name), f.type)
        out: dict[str, pa.Array] = {}
        for name, typ in types.items():
            def part(side: str, name: str = name, typ: pa.DataType = typ) -> pa.Array:
                arr = sides.get(side)
                if arr is None or arr.type.get_field_index(name) < 0:
                    return pa.nulls(len(t), typ)
                return pc.cast(pc.struct_field(arr, name), typ)
            out[name] = pc.if_else(use_after, part("after"), part("before"))
        return out

    @staticmethod
    def _cdc(t: pa.Table, kafka: pa.StructArray, ops: list[Any]) -> pa.StructArray:
        ts: pa.Array = pa.nulls(len(t), pa.int64())
        if "ts_ms" in t.column_names and pa.types.is_integer(t.column("ts_ms").type):
            ts = pc.cast(t.column("ts_ms").combine_chunks(), pa.int64())
        sources: list[str | None] = [None] * len(t)
        if "source" in t.column_names and pa.types.is_struct(t.column("source").type):
            for i, s in enumerate(t.column("source").to_pylist()):
                db = (s or {}).get("schema") or (s or {}).get("db")
                table = (s or {}).get("table")
                sources[i] = f"{db}.{table}" if db and table else None
        return pa.StructArray.from_arrays(
            [pa.array([OPS.get(o, "I") for o in ops], pa.string()), ts,
             kafka.field("offset"), pa.array(sources, pa.string())],
            fields=list(CDC_TYPE))
