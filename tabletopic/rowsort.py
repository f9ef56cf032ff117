"""Row work on Arrow tables that the table layout (tabletopic.partitioning) and upserts
(tabletopic.upsert) share: a column found by a dotted path, and rows sorted by a sort order.

Kept apart from tabletopic.partitioning so that the topic configs (which parse a layout) do
not import pyarrow: a broker without table topics never loads it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tabletopic.partitioning import SortBy


def column(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    """The column at `name` (dots reach into structs), or None when `table` lacks it."""
    parts = name.split(".")
    if parts[0] not in table.column_names:
        return None
    col = table.column(parts[0])
    for part in parts[1:]:
        if not pa.types.is_struct(col.type) or col.type.get_field_index(part) < 0:
            return None
        col = pc.struct_field(col, part)
    return col


def sort_rows(data: pa.Table, order: tuple[SortBy, ...]) -> pa.Table:
    """`data` sorted by `order` (columns `data` lacks are skipped). Each key sorts first on
    its null flag (nulls first or last per key), then on its value."""
    keys: dict[str, pa.ChunkedArray] = {}
    sort_keys: list[tuple[str, str]] = []
    for i, s in enumerate(order):
        col = column(data, s.column)
        if col is None:
            continue
        keys[f"n{i}"] = pc.is_null(col)
        keys[f"v{i}"] = col
        sort_keys += [(f"n{i}", "descending" if s.nulls_first else "ascending"),
                      (f"v{i}", "descending" if s.descending else "ascending")]
    if not sort_keys:
        return data
    indices = pc.sort_indices(pa.table(keys), sort_keys=sort_keys)
    return data.take(indices)
