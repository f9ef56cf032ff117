"""`table.topic.partition.by` and `table.topic.sort.by`: the Iceberg layout of a table topic.

partition.by (AutoMQ's syntax): a bracketed, comma-separated list of `col` or `identity(col)`,
`bucket(col, N)`, `truncate(col, W)`, `year(col)`, `month(col)`, `day(col)`, `hour(col)`;
`col` is a value column or a nested field by dots (`_kafka.timestamp`, `after.region`).
sort.by: a list of `col [asc|desc] [nulls first|nulls last]` (Iceberg's defaults: asc, nulls
first for asc, nulls last for desc).

The syntax is checked when the topic's config is set (CreateTopics, AlterConfigs: a bad spec is
INVALID_CONFIG naming the problem). Columns are checked against the table at commit time: a
schema-less topic's columns appear with its first records, so a layout naming a column the
table does not hold yet is applied by the first commit that brings it (until then the table
keeps its current layout). A layout differing from the table's is staged into the same
commit as the rows (`stage_layout`): the partition spec evolves (old files keep the spec they
were written with, nothing is rewritten) and the sort order is replaced. An empty setting
leaves the table's spec or order alone (floe does not undo a layout set by hand or by Spark).

Rows are written one file per partition value set (pyiceberg splits an append by the table's
current spec; a null source value makes a null partition value, its own partition) and each
file's rows are sorted by the sort order (`sort_rows` in tabletopic.rowsort; pyiceberg keeps
row order within a partition).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_FIELD = re.compile(rf"^(?:(?P<fn>[a-z]+)\(\s*(?P<col>{_NAME})\s*(?:,\s*(?P<arg>\d+)\s*)?\)"
                    rf"|(?P<bare>{_NAME}))$", re.IGNORECASE)
_SORT = re.compile(rf"^(?P<col>{_NAME})(?:\s+(?P<dir>asc|desc))?"
                   r"(?:\s+nulls\s+(?P<nulls>first|last))?$", re.IGNORECASE)
_UNARY: dict[str, Callable[[], Transform[Any, Any]]] = {
    "identity": IdentityTransform, "year": YearTransform, "month": MonthTransform,
    "day": DayTransform, "hour": HourTransform}
_SIZED: dict[str, Callable[[int], Transform[Any, Any]]] = {
    "bucket": BucketTransform, "truncate": TruncateTransform}


class LayoutError(ValueError):
    """A partition.by / sort.by value that cannot be parsed; the message names the problem."""


@dataclass(frozen=True)
class PartitionBy:
    column: str
    transform: str  # identity | bucket | truncate | year | month | day | hour
    arg: int | None = None  # bucket: N, truncate: W

    @property
    def name(self) -> str:
        """The partition field's name: pyiceberg's default for a top-level column, with the
        dots of a nested one made underscores (engines take a dotted name for a path)."""
        base = self.column.replace(".", "_")
        if self.transform == "identity":
            return base
        if self.arg is not None:
            return f"{base}_{'trunc' if self.transform == 'truncate' else 'bucket'}_{self.arg}"
        return f"{base}_{self.transform}"

    def iceberg(self) -> Transform[Any, Any]:
        if self.arg is not None:
            return _SIZED[self.transform](self.arg)
        return _UNARY[self.transform]()


@dataclass(frozen=True)
class SortBy:
    column: str
    descending: bool = False
    nulls_first: bool = True


@dataclass(frozen=True)
class Layout:
    partition_by: tuple[PartitionBy, ...] = ()
    sort_by: tuple[SortBy, ...] = ()


def _items(raw: str, key: str) -> list[str]:
    text = raw.strip()
    if not text:
        return []
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if not inner.strip():
        return []
    items, depth, cur = [], 0, ""
    for ch in inner:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise LayoutError(f"{key}: unbalanced parentheses in {raw!r}")
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if depth:
        raise LayoutError(f"{key}: unbalanced parentheses in {raw!r}")
    items.append(cur.strip())
    if any(not i for i in items):
        raise LayoutError(f"{key}: empty entry in {raw!r}")
    return items


def parse_partition_by(raw: str) -> tuple[PartitionBy, ...]:
    out: list[PartitionBy] = []
    for item in _items(raw, "partition.by"):
        m = _FIELD.match(item)
        if m is None:
            raise LayoutError(f"partition.by: cannot parse {item!r}")
        if m["bare"]:
            out.append(PartitionBy(m["bare"], "identity"))
            continue
        fn, arg = m["fn"].lower(), m["arg"]
        if fn in _SIZED:
            if arg is None or int(arg) <= 0:
                raise LayoutError(f"partition.by: {fn}({m['col']}, N) needs a positive N")
            out.append(PartitionBy(m["col"], fn, int(arg)))
        elif fn in _UNARY:
            if arg is not None:
                raise LayoutError(f"partition.by: {fn}() takes one column, got {item!r}")
            out.append(PartitionBy(m["col"], fn))
        else:
            raise LayoutError(f"partition.by: unknown transform {fn!r} in {item!r} (one of "
                              f"{', '.join([*_UNARY, *_SIZED])})")
    seen = [(p.column, p.transform, p.arg) for p in out]
    if len(set(seen)) != len(seen):
        raise LayoutError(f"partition.by: a field is listed twice in {raw!r}")
    return tuple(out)


def parse_sort_by(raw: str) -> tuple[SortBy, ...]:
    out: list[SortBy] = []
    for item in _items(raw, "sort.by"):
        m = _SORT.match(item)
        if m is None:
            raise LayoutError(f"sort.by: cannot parse {item!r} (col [asc|desc] "
                              "[nulls first|nulls last])")
        desc = (m["dir"] or "asc").lower() == "desc"
        nulls = m["nulls"]
        out.append(SortBy(m["col"], desc, not desc if nulls is None else nulls.lower() == "first"))
    return tuple(out)


def parse_id_columns(raw: str) -> tuple[str, ...]:
    """id.columns: `[region, name]` (or without brackets): column names, nested by dots."""
    text = raw.strip()
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    names = [n.strip() for n in inner.split(",")] if inner.strip() else []
    for n in names:
        if not re.fullmatch(_NAME, n):
            raise LayoutError(f"id.columns: {n!r} is not a column name")
    if len(set(names)) != len(names):
        raise LayoutError(f"id.columns: a column is listed twice in {raw!r}")
    return tuple(names)


def _has(schema: Schema, column: str) -> bool:
    try:
        schema.find_field(column)
    except ValueError:
        return False
    return True


def _spec_key(spec: PartitionSpec, schema: Schema) -> list[tuple[str, str]]:
    out = []
    for f in spec.fields:
        name = schema.find_column_name(f.source_id)
        if name is not None and str(f.transform) != "void":
            out.append((name, str(f.transform)))
    return out


def _order_key(order: SortOrder, schema: Schema) -> list[tuple[str, bool, bool]]:
    return [(schema.find_column_name(f.source_id) or "", f.direction == SortDirection.DESC,
             f.null_order == NullOrder.NULLS_FIRST) for f in order.fields]


def stage_layout(tx: Transaction, layout: Layout) -> bool:
    """Stage, on `tx`, the partition spec and sort order of `layout` where they differ from the
    table's (as staged so far: after a schema change in the same transaction) and every column
    they name exists. Returns whether anything was staged."""
    meta = tx.table_metadata
    schema = meta.schema()
    staged = False
    want = [(p.column, str(p.iceberg())) for p in layout.partition_by]
    have = _spec_key(meta.spec(), schema)
    if want and want != have and all(_has(schema, p.column) for p in layout.partition_by):
        by_key = {(schema.find_column_name(f.source_id), str(f.transform)): f.name
                  for f in meta.spec().fields if str(f.transform) != "void"}
        with tx.update_spec() as update:
            for key, name in by_key.items():
                if key not in want:
                    update.remove_field(name)
            for p in layout.partition_by:
                if (p.column, str(p.iceberg())) not in by_key:
                    update.add_field(p.column, p.iceberg(), p.name)
        staged = True
    want_order = [(s.column, s.descending, s.nulls_first) for s in layout.sort_by]
    if want_order and want_order != _order_key(meta.sort_order(), schema) \
            and all(_has(schema, s.column) for s in layout.sort_by):
        with tx.update_sort_order() as order:
            for s in layout.sort_by:
                nulls = NullOrder.NULLS_FIRST if s.nulls_first else NullOrder.NULLS_LAST
                if s.descending:
                    order.desc(s.column, IdentityTransform(), nulls)
                else:
                    order.asc(s.column, IdentityTransform(), nulls)
        staged = True
    return staged

