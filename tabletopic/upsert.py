"""Upsert and CDC table topics (`table.topic.upsert.enable`, `.id.columns`, `.cdc.field`): the
table holds exactly the latest row per key, deleted keys gone.

How (copy-on-write, chosen by measurement: see README "Upsert and CDC tables"): every floe
commit of an upsert table is one overwrite snapshot, in the one guarded catalog commit that
moves `floe.offsets` (tabletopic.commit):
  1. the batch is reduced to the latest row per key (the row of the highest offset; rows of
     one key in two Kafka partitions: the higher partition's wins), `latest_rows`;
  2. the data files that may hold a key the batch touches (by the first id column's bounds)
     are read, their delete files applied; those that do hold one are replaced: their other
     rows are written again together with the batch's latest rows that are not deletes
     (`cdc.field` = D), one set of new files (partitioned and sorted like any append).
The table never holds merge-on-read delete files, so every reader (pyiceberg 0.12, which cannot
read equality deletes, included) sees the same rows, and the files a key touched are merged
as they are rewritten. A replayed range cannot apply twice: the commit is refused unless the
table is at the range's start offsets (tabletopic.commit), and a reduced batch applied to a
table is idempotent anyway (replace the keys' rows by their latest rows).

Operations: `cdc.field` names a column (nested by dots; default `_cdc.op` with
transform.value.type=flatten_debezium) whose value D (or d) deletes the key; any other value
(I, U, c, r, u, null) upserts. Without `cdc.field` every row upserts. A row with a null id
column has no key: it is appended as is and never replaced.
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.table import Transaction
from pyiceberg.types import IntegerType, LongType, StringType

from tabletopic.rowsort import column

log = logging.getLogger(__name__)
ROW = "__floe_row"


@dataclass(frozen=True)
class Upsert:
    id_columns: tuple[str, ...]
    cdc_field: str = ""  # "": every row upserts


@dataclass(frozen=True)
class Reduced:
    rows: pa.Table  # what to append: the latest row of each key unless it is a delete
    keys: list[tuple[Any, ...]]  # every key the batch touches (to delete from the table first)


def latest_rows(data: pa.Table, upsert: Upsert) -> Reduced | None:
    """The batch reduced to one row per key (see the module docstring). None when the batch
    lacks an id column (it is appended as is; a warning says why)."""
    cols = [column(data, c) for c in upsert.id_columns]
    present = [c for c in cols if c is not None]
    if not upsert.id_columns or len(present) != len(cols):
        log.warning("upsert: id.columns %s not all in the rows: appended as is",
                    list(upsert.id_columns))
        return None
    kafka = data.column("_kafka")
    order = pa.table({"p": pc.struct_field(kafka, "partition"),
                      "o": pc.struct_field(kafka, "offset")})
    data = data.take(pc.sort_indices(order, sort_keys=[("p", "ascending"), ("o", "ascending")]))
    keys = {f"k{i}": c for i, c in enumerate(column(data, c) for c in upsert.id_columns)}
    table = pa.table({**keys, ROW: pa.array(range(data.num_rows), pa.int64())})
    has_key = pa.chunked_array(
        functools.reduce(pc.and_, [pc.is_valid(c) for c in keys.values()])
    ).combine_chunks()
    last = table.filter(has_key).group_by(list(keys)).aggregate([(ROW, "max")])
    latest = last.column(f"{ROW}_max").combine_chunks()
    key_values = list(zip(*(last.column(k).to_pylist() for k in keys), strict=True))
    keep = pc.or_(pc.is_in(table.column(ROW), value_set=latest), pc.invert(has_key))
    if upsert.cdc_field:
        op = column(data, upsert.cdc_field)
        if op is not None:
            deleted = pc.fill_null(pc.equal(pc.utf8_upper(pc.cast(op, pa.string())), "D"), False)
            keep = pc.and_(keep, pc.invert(deleted))
    return Reduced(data.filter(keep), key_values)


def _candidates(tx: Transaction, upsert: Upsert, keys: list[tuple[Any, ...]]) -> list[Any]:
    """The current data files (scan tasks, with their delete files) that may hold one of
    `keys`: by the first id column's lower/upper bounds when it is an int, long or string
    (sorted keys, one bisection per file); every file otherwise."""
    tasks = list(tx._table.scan().plan_files())  # the snapshot the commit builds on
    schema = tx.table_metadata.schema()
    try:
        field = schema.find_field(upsert.id_columns[0])
    except ValueError:
        return tasks
    if not isinstance(field.field_type, IntegerType | LongType | StringType):
        return tasks
    firsts = sorted({k[0] for k in keys})
    out = []
    for task in tasks:
        lo = (task.file.lower_bounds or {}).get(field.field_id)
        hi = (task.file.upper_bounds or {}).get(field.field_id)
        if lo is None or hi is None:
            out.append(task)
            continue
        i = bisect.bisect_left(firsts, from_bytes(field.field_type, lo))
        if i < len(firsts) and firsts[i] <= from_bytes(field.field_type, hi):
            out.append(task)
    return out


def stage_upsert(
    tx: Transaction, data: pa.Table, upsert: Upsert, summary: dict[str, str],
    sort: Callable[[pa.Table], pa.Table] = lambda t: t,
) -> None:
    """Stage on `tx` one snapshot (summary `summary`) that replaces every key `data` touches:
    the files holding such keys are read (their delete files applied), and their other rows
    written again together with the batch's latest rows (sorted by `sort`), in place of them
    (an overwrite); a batch touching no stored key is a plain append."""
    reduced = latest_rows(data, upsert)
    rows = data if reduced is None else reduced.rows
    meta = tx.table_metadata
    replaced, kept = [], []
    if reduced is not None and reduced.keys and meta.current_snapshot_id is not None:
        touched = pa.table({f"k{i}": pa.array([k[i] for k in reduced.keys])
                            for i in range(len(upsert.id_columns))})
        scan = ArrowScan(meta, tx._table.io, meta.schema(), AlwaysTrue())
        for task in _candidates(tx, upsert, reduced.keys):
            old = scan.to_table([task])
            cols = [column(old, c) for c in upsert.id_columns]
            if any(c is None for c in cols):
                continue
            probe = pa.table({f"k{i}": c for i, c in enumerate(cols)})
            wanted = pa.table({n: touched.column(n).cast(probe.column(n).type)
                               for n in touched.column_names})
            hit = probe.append_column(ROW, pa.array(range(old.num_rows), pa.int64())).join(
                wanted, list(wanted.column_names), join_type="left semi").column(ROW)
            if len(hit):
                replaced.append(task.file)
                keep = pc.invert(pc.is_in(pa.array(range(old.num_rows), pa.int64()),
                                          value_set=hit.combine_chunks()))
                kept.append(old.filter(keep))
    if kept:
        rows = pa.concat_tables([*kept, rows], promote_options="permissive")
    producer = tx.update_snapshot(snapshot_properties=summary)
    with producer.overwrite() if replaced else producer.fast_append() as snapshot:
        for f in replaced:
            snapshot.delete_data_file(f)
        if rows.num_rows:
            for f in _dataframe_to_data_files(meta, sort(rows), tx._table.io,
                                              snapshot.commit_uuid):
                snapshot.append_data_file(f)
