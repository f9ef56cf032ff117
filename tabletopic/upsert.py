"""Upsert and CDC table topics (`table.topic.upsert.enable`, `.id.columns`, `.cdc.field`): the
table holds exactly the latest row per key, deleted keys gone.

How (copy-on-write, chosen by measurement: see README "Upsert and CDC tables"): every floe
commit of an upsert table, in the one catalog commit that moves `floe.offsets`,
  1. reduces its rows to the latest row per key (the row of the highest offset; rows of one
     key in two Kafka partitions: the higher partition's wins), `latest_rows`;
  2. deletes every key the commit touches from the table (`tx.delete` with `id IN (...)`:
     pyiceberg drops the data files that hold only such keys and rewrites the others without
     them);
  3. appends the latest rows whose operation is not a delete (`cdc.field` = D).
The table never holds merge-on-read delete files, so every reader (pyiceberg 0.12, which cannot
read equality deletes, included) sees the same rows. A replayed range cannot apply twice: the
commit is refused unless the table is at the range's start offsets (tabletopic.commit), and a
reduced batch applied to a table is idempotent anyway (delete the keys, insert their rows).

Operations: `cdc.field` names a column (nested by dots; default `_cdc.op` with
transform.value.type=flatten_debezium) whose value D (or d) deletes the key; any other value
(I, U, c, r, u, null) upserts. Without `cdc.field` every row upserts. A row with a null id
column has no key: it is appended as is and never replaced.
"""

from __future__ import annotations

import functools
import logging
import operator
import warnings
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression, EqualTo, In, Or
from pyiceberg.table import Transaction

log = logging.getLogger(__name__)
ROW = "__floe_row"


@dataclass(frozen=True)
class Upsert:
    id_columns: tuple[str, ...]
    cdc_field: str = ""  # "": every row upserts


def _column(data: pa.Table, name: str) -> pa.ChunkedArray | None:
    parts = name.split(".")
    if parts[0] not in data.column_names:
        return None
    col = data.column(parts[0])
    for part in parts[1:]:
        if not pa.types.is_struct(col.type) or col.type.get_field_index(part) < 0:
            return None
        col = pc.struct_field(col, part)
    return col


@dataclass(frozen=True)
class Reduced:
    rows: pa.Table  # what to append: the latest row of each key unless it is a delete
    keys: list[tuple[Any, ...]]  # every key the batch touches (to delete from the table first)


def latest_rows(data: pa.Table, upsert: Upsert) -> Reduced | None:
    """The batch reduced to one row per key (see the module docstring). None when the batch
    lacks an id column (it is appended as is; a warning says why)."""
    cols = [_column(data, c) for c in upsert.id_columns]
    present = [c for c in cols if c is not None]
    if not upsert.id_columns or len(present) != len(cols):
        log.warning("upsert: id.columns %s not all in the rows: appended as is",
                    list(upsert.id_columns))
        return None
    kafka = data.column("_kafka")
    order = pa.table({"p": pc.struct_field(kafka, "partition"),
                      "o": pc.struct_field(kafka, "offset")})
    data = data.take(pc.sort_indices(order, sort_keys=[("p", "ascending"), ("o", "ascending")]))
    keys = {f"k{i}": c for i, c in enumerate(_column(data, c) for c in upsert.id_columns)}
    table = pa.table({**keys, ROW: pa.array(range(data.num_rows), pa.int64())})
    has_key = pa.chunked_array(
        functools.reduce(pc.and_, [pc.is_valid(c) for c in keys.values()])
    ).combine_chunks()
    last = table.filter(has_key).group_by(list(keys)).aggregate([(ROW, "max")])
    latest = last.column(f"{ROW}_max").combine_chunks()
    key_values = list(zip(*(last.column(k).to_pylist() for k in keys), strict=True))
    keep = pc.or_(pc.is_in(table.column(ROW), value_set=latest), pc.invert(has_key))
    if upsert.cdc_field:
        op = _column(data, upsert.cdc_field)
        if op is not None:
            deleted = pc.fill_null(pc.equal(pc.utf8_upper(pc.cast(op, pa.string())), "D"), False)
            keep = pc.and_(keep, pc.invert(deleted))
    return Reduced(data.filter(keep), key_values)


def key_filter(id_columns: tuple[str, ...], keys: list[tuple[Any, ...]]) -> BooleanExpression:
    """`id IN (...)` (one column), else an OR of per-key ANDs."""
    if len(id_columns) == 1:
        # pyiceberg's predicates take (term, literals) at run time; their pydantic-typed
        # signatures say otherwise
        return In(id_columns[0], {k[0] for k in keys})  # type: ignore[call-arg,arg-type]
    ands = [functools.reduce(operator.and_, [EqualTo(c, v)  # type: ignore[call-arg,arg-type]
                                             for c, v in
                                             zip(id_columns, k, strict=True)]) for k in keys]
    return ands[0] if len(ands) == 1 else Or(*ands)


def stage_upsert(
    tx: Transaction, data: pa.Table, upsert: Upsert, summary: dict[str, str]
) -> pa.Table:
    """Stage on `tx` the deletion of every key `data` touches (snapshots carrying `summary`)
    and return the rows to append after it."""
    reduced = latest_rows(data, upsert)
    if reduced is None:
        return data
    if reduced.keys and tx.table_metadata.current_snapshot_id is not None:
        with warnings.catch_warnings():  # "Delete operation did not match any records"
            warnings.simplefilter("ignore", UserWarning)
            tx.delete(key_filter(upsert.id_columns, reduced.keys),
                      snapshot_properties=summary)
    return reduced.rows
