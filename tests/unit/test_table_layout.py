"""table.topic.partition.by / sort.by (tabletopic.partitioning): parsing and validation, files
written one per partition value set (nulls included), the spec evolving live without rewriting
old files, and each file sorted by the sort order. Commits go through the broker's own commit
(tabletopic.commit.commit_offsets)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO

from broker.config import ConfigError, TopicConfig
from tabletopic.commit import commit_offsets
from tabletopic.config import TableTopicConfig
from tabletopic.contract import table_offsets
from tabletopic.convert import KAFKA_TYPE
from tabletopic.partitioning import (
    Layout,
    LayoutError,
    PartitionBy,
    SortBy,
    parse_partition_by,
    parse_sort_by,
)

IDENT = ("ns", "events")
DAY0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def rows(start: int, values: list[tuple[int, dt.datetime | None, str | None]]) -> pa.Table:
    """Rows at offsets start.. of partition 0: (id, ts, name)."""
    n = len(values)
    kafka: list[dict[str, Any]] = [
        {"partition": 0, "offset": start + i, "timestamp": DAY0, "key": None, "headers": []}
        for i in range(n)]
    return pa.table({
        "_kafka": pa.array(kafka, KAFKA_TYPE),
        "id": pa.array([v[0] for v in values], pa.int64()),
        "ts": pa.array([v[1] for v in values], pa.timestamp("us", tz="UTC")),
        "name": pa.array([v[2] for v in values], pa.string()),
    })


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog("floe", uri=f"sqlite:///{tmp_path / 'c.db'}",
                     warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("ns")
    cat.create_table(IDENT, schema=pa.schema([pa.field("_kafka", KAFKA_TYPE, nullable=False)]),
                     properties={"format-version": "2", "floe.topic": "events"})
    return cat


def commit(cat: SqlCatalog, data: pa.Table, layout: Layout) -> None:
    start = table_offsets(cat.load_table(IDENT)).get(0, 0)
    commit_offsets(cat, IDENT, "events", data, {0: start}, {0: start + data.num_rows},
                   layout=layout)


def files(cat: SqlCatalog) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = cat.load_table(IDENT).inspect.files().select(
        ["file_path", "partition", "record_count", "spec_id"]).to_pylist()
    return out


def test_parse_partition_and_sort_specs() -> None:
    assert parse_partition_by("[bucket(name, 16), month(ts)]") == (
        PartitionBy("name", "bucket", 16), PartitionBy("ts", "month"))
    assert parse_partition_by("[region, identity(a.b), truncate(s, 4), hour(_kafka.timestamp)]") \
        == (PartitionBy("region", "identity"), PartitionBy("a.b", "identity"),
            PartitionBy("s", "truncate", 4), PartitionBy("_kafka.timestamp", "hour"))
    assert parse_partition_by("") == () == parse_partition_by("[]")
    assert parse_sort_by("[ts desc, id, n asc nulls last]") == (
        SortBy("ts", True, False), SortBy("id"), SortBy("n", False, False))
    for bad, why in [("[foo(x)]", "unknown transform 'foo'"), ("[bucket(x)]", "positive N"),
                     ("[bucket(x, 0)]", "positive N"), ("[day(x, 2)]", "takes one column"),
                     ("[a,,b]", "empty entry"), ("[day(x]", "unbalanced"), ("[a-b]", "parse"),
                     ("[a, a]", "twice")]:
        with pytest.raises(LayoutError, match=why):
            parse_partition_by(bad)
    with pytest.raises(LayoutError, match="cannot parse 'ts sideways'"):
        parse_sort_by("[ts sideways]")


def test_bad_spec_is_a_config_error_naming_the_problem() -> None:
    with pytest.raises(ConfigError, match=r"table\.topic\.partition\.by.*unknown transform 'week'"):
        TopicConfig.parse({"automq.table.topic.partition.by": "[week(ts)]"})
    cfg = TableTopicConfig.of("t", {"table.topic.partition.by": "[day(ts), bucket(id, 8)]",
                                    "table.topic.sort.by": "[ts desc]"})
    assert cfg.layout == Layout((PartitionBy("ts", "day"), PartitionBy("id", "bucket", 8)),
                                (SortBy("ts", True, False),))


def test_one_file_per_partition_nulls_included(catalog: SqlCatalog) -> None:
    layout = Layout(parse_partition_by("[day(ts), bucket(id, 8)]"), parse_sort_by("[id desc]"))
    day1 = DAY0 + dt.timedelta(days=1)
    data = rows(0, [(i, DAY0 if i % 2 else day1, "n") for i in range(40)] + [(99, None, None)])
    commit(catalog, data, layout)
    table = catalog.load_table(IDENT)
    assert [str(f.transform) for f in table.spec().fields] == ["day", "bucket[8]"]
    fs = files(catalog)
    parts = {(f["partition"]["ts_day"], f["partition"]["id_bucket_8"]) for f in fs}
    assert len(parts) == len(fs)  # one file per partition value set
    assert sum(f["record_count"] for f in fs) == 41
    days = {p[0] for p in parts}
    assert days == {DAY0.date(), day1.date(), None}  # the null ts: its own partition
    for f in fs:  # each file sorted by id desc
        ids = pq.read_table(PyArrowFileIO().new_input(f["file_path"]).open()).column("id")
        assert ids.to_pylist() == sorted(ids.to_pylist(), reverse=True)
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [*range(40), 99]
    assert [str(f.transform) for f in table.sort_order().fields] == ["identity"]


def test_layout_waits_for_its_columns(catalog: SqlCatalog) -> None:
    """A column the table does not hold yet: the first commit that brings it partitions."""
    layout = Layout(parse_partition_by("[identity(name)]"))
    commit(catalog, rows(0, [(1, DAY0, "a")]).drop_columns(["name"]), layout)
    assert catalog.load_table(IDENT).spec().is_unpartitioned()
    commit(catalog, rows(1, [(2, DAY0, "a"), (3, DAY0, "b")]), layout)
    assert {f["partition"].get("name") for f in files(catalog) if f["spec_id"] == 1} == {"a", "b"}


def test_live_spec_change_keeps_old_files(catalog: SqlCatalog) -> None:
    commit(catalog, rows(0, [(i, DAY0, "x") for i in range(10)]),
           Layout(parse_partition_by("[day(ts)]")))
    before = {f["file_path"] for f in files(catalog)}
    commit(catalog, rows(10, [(i, DAY0, "y") for i in range(10, 20)]),
           Layout(parse_partition_by("[bucket(id, 4)]")))
    table = catalog.load_table(IDENT)
    fs = files(catalog)
    assert before <= {f["file_path"] for f in fs}  # nothing rewritten
    assert {f["spec_id"] for f in fs} == {1, 2}
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[4]"]
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(20))
    assert table_offsets(table) == {0: 20}
    commit(catalog, rows(20, [(20, DAY0, "z")]), Layout(parse_partition_by("[bucket(id, 4)]")))
    assert len(catalog.load_table(IDENT).metadata.partition_specs) == 3  # not evolved again
