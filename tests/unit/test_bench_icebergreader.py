"""benchmarks.icebergreader: row visibility from scans of a real (SQLite + file) Iceberg table,
and the set comparison of its rows with the acknowledged records."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.icebergreader import (
    TableReader,
    compare_rows,
    open_catalog,
    row_visibility,
    scan_offsets,
)

KAFKA = pa.struct([pa.field("partition", pa.int32(), False), pa.field("offset", pa.int64(), False)])
SCHEMA = pa.schema([pa.field("_kafka", KAFKA, nullable=False), pa.field("v", pa.int64())])
TABLE = ("default", "t")


def _rows(pairs: list[tuple[int, int]]) -> pa.Table:
    kafka = pa.array([{"partition": p, "offset": o} for p, o in pairs], KAFKA)
    return pa.table({"_kafka": kafka, "v": pa.array([o for _p, o in pairs], pa.int64())}, SCHEMA)


def _append(table: object, pairs: list[tuple[int, int]], offsets: dict[int, int]) -> None:
    table.append(_rows(pairs), snapshot_properties={"floe.offsets": json.dumps(offsets)})  # type: ignore[attr-defined]


def _wait(cond: object, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def _table_and_reader(tmp_path: Path) -> tuple[str, str, Any, TableReader]:
    """A new table in a SQLite catalog + file warehouse, and a started scanning reader."""
    uri, warehouse = f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri()
    catalog = open_catalog(uri, warehouse)
    catalog.create_namespace("default")
    table = catalog.create_table(TABLE, schema=SCHEMA)
    reader = TableReader(uri, warehouse, TABLE, scan_rows=True)
    reader.start()
    return uri, warehouse, table, reader


def test_the_reader_sees_each_row_when_a_scan_of_the_current_snapshot_returns_it(
    tmp_path: Path,
) -> None:
    uri, warehouse, table, reader = _table_and_reader(tmp_path)
    try:
        _append(table, [(0, 0), (0, 1), (1, 0)], {0: 2, 1: 1})
        _wait(lambda: len(reader.rows) == 3)
        first = dict(reader.rows)
        acked_later = time.time()
        _append(table, [(0, 2), (1, 1)], {0: 3, 1: 2})
        _wait(lambda: len(reader.rows) == 5)
    finally:
        reader.stop()
    assert reader.duplicates == 0 and reader.errors == 0, reader.last_error
    # rows already read keep the moment they were first returned
    assert all(reader.rows[k] == v for k, v in first.items())
    assert reader.rows[0, 2][0] >= acked_later and reader.rows[1, 1][0] >= acked_later
    assert [s.offsets for s in reader.seen] == [{0: 2, 1: 1}, {0: 3, 1: 2}]
    acks = {0: [(0, 0.0), (1, 0.0), (2, acked_later), (3, acked_later)], 1: [(0, 0.0)]}
    records = row_visibility(acks, reader.rows)
    never = [(r.partition, r.offset) for r in records if r.visible_at is None]
    assert never == [(0, 3)]  # acknowledged, never returned by a scan: reported, not dropped
    assert sorted(scan_offsets(uri, warehouse, TABLE)) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def test_a_row_written_twice_is_a_duplicate_for_the_reader_and_the_set_comparison(
    tmp_path: Path,
) -> None:
    uri, warehouse, table, reader = _table_and_reader(tmp_path)
    try:
        _append(table, [(0, 0), (0, 1)], {0: 2})
        _wait(lambda: len(reader.seen) == 1)
        _append(table, [(0, 1)], {0: 2})  # the same record again
        _wait(lambda: len(reader.seen) == 2)
    finally:
        reader.stop()
    assert reader.duplicates == 1
    check = compare_rows([(0, 0), (0, 1)], scan_offsets(uri, warehouse, TABLE))
    assert (check.rows, check.missing, check.extra, check.duplicates) == (3, 0, 0, 1)
    assert "1 duplicated" in check.problem


def test_the_set_comparison_names_missing_and_unacknowledged_rows() -> None:
    check = compare_rows([(0, 0), (0, 1), (1, 0)], [(0, 0), (1, 0), (2, 5)])
    assert (check.rows, check.missing, check.extra, check.duplicates) == (3, 1, 1, 0)
    # a count alone would have said 3 == 3
    assert check.problem == (
        "table vs acknowledged records: 1 missing, 1 never acknowledged, 0 duplicated"
    )
    assert compare_rows([(0, 0)], [(0, 0)]).problem == ""
