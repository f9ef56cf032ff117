"""Spark reads partitioned table topics (tabletopic.partitioning) and prunes their files: a table
partitioned by day(ts) and bucket(id, 8) (written with the broker's own commit) has each file
under the partition its rows belong to (pyiceberg's files table), Spark scans only the matching
file (the BatchScan's resultDataFiles / skippedDataFiles metrics), and after partition.by
changes live the rows of both layouts read back in Spark."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType

from tabletopic.commit import commit_offsets
from tabletopic.contract import table_offsets
from tabletopic.convert import KAFKA_TYPE
from tabletopic.partitioning import Layout, parse_partition_by
from tests.spark.conftest import SparkEnv
from tests.unit.test_table_layout import DAY0, rows

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
IDENT = ("layout", "events")


def scan_metrics(env: SparkEnv, sql: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The rows of `sql` and the metrics of its Iceberg BatchScan (the executed plan's)."""
    df = env.spark.sql(sql)
    out = [r.asDict() for r in df.collect()]
    metrics: dict[str, int] = {}
    todo = [df._jdf.queryExecution().executedPlan()]
    while todo:
        node = todo.pop()
        if node.nodeName().startswith("BatchScan"):
            it = node.metrics().iterator()
            while it.hasNext():
                kv = it.next()
                metrics[kv._1()] = int(kv._2().value())
        children = node.children().iterator()
        while children.hasNext():
            todo.append(children.next())
    return out, metrics


def commit(env: SparkEnv, data: pa.Table, spec: str) -> None:
    start = table_offsets(env.catalog.load_table(IDENT)).get(0, 0)
    commit_offsets(env.catalog, IDENT, "events", data, {0: start}, {0: start + data.num_rows},
                   layout=Layout(parse_partition_by(spec)))


def test_partitioned_files_pruned_and_live_spec_change(spark_env: SparkEnv) -> None:
    env = spark_env
    env.catalog.create_namespace_if_not_exists("layout")
    env.catalog.create_table(
        IDENT, schema=pa.schema([pa.field("_kafka", KAFKA_TYPE, nullable=False)]),
        properties={"format-version": "2", "floe.topic": "events"})
    commit(env, rows(0, [(i, DAY0 + dt.timedelta(days=i % 3), f"n{i}") for i in range(96)]),
           "[day(ts), bucket(id, 8)]")
    bucket = BucketTransform[int](8).transform(LongType())
    files = env.catalog.load_table(IDENT).inspect.files().to_pylist()
    assert len(files) == 24  # 3 days x 8 buckets, every one of them filled
    for f in files:
        got = pq.read_table(PyArrowFileIO().new_input(f["file_path"]).open())
        for r in got.select(["id", "ts"]).to_pylist():
            assert (r["ts"].date(), bucket(r["id"])) == \
                (f["partition"]["ts_day"], f["partition"]["id_bucket_8"])

    day1 = "TIMESTAMP '2026-03-02 00:00:00'"
    day2 = "TIMESTAMP '2026-03-03 00:00:00'"
    got, m = scan_metrics(env, f"SELECT id, name FROM floe.layout.events "
                               f"WHERE ts >= {day1} AND ts < {day2} AND id = 7")
    assert got == [{"id": 7, "name": "n7"}]
    assert (m["resultDataFiles"], m["skippedDataFiles"]) == (1, 23)

    # partition.by changed live: new files by bucket(id, 4), the old ones stay as they are
    commit(env, rows(96, [(i, DAY0, f"n{i}") for i in range(96, 140)]), "[bucket(id, 4)]")
    table = env.catalog.load_table(IDENT)
    assert {f["spec_id"] for f in table.inspect.files().to_pylist()} == {1, 2}
    every, m = scan_metrics(env, "SELECT id, name FROM floe.layout.events")
    assert sorted((r["id"], r["name"]) for r in every) == [(i, f"n{i}") for i in range(140)]
    assert m["resultDataFiles"] == 28
    got, m = scan_metrics(env, "SELECT id FROM floe.layout.events WHERE id IN (7, 100)")
    assert sorted(r["id"] for r in got) == [7, 100]
    assert m["resultDataFiles"] < 28 and m["skippedDataFiles"] > 0


def test_nested_and_truncate_partitions_read_in_spark(spark_env: SparkEnv) -> None:
    """hour(_kafka.timestamp) (a nested source: the partition field `_kafka_timestamp_hour`),
    truncate(name, 2) with null names (their own partition), identity(id)."""
    env = spark_env
    ident = ("layout", "nested")
    env.catalog.create_namespace_if_not_exists("layout")
    env.catalog.create_table(
        ident, schema=pa.schema([pa.field("_kafka", KAFKA_TYPE, nullable=False)]),
        properties={"format-version": "2", "floe.topic": "nested"})
    data = rows(0, [(i, DAY0, None if i % 4 == 0 else f"{'ab' if i % 2 else 'cd'}{i}")
                    for i in range(20)])
    commit_offsets(env.catalog, ident, "nested", data, {0: 0}, {0: 20}, layout=Layout(
        parse_partition_by("[hour(_kafka.timestamp), truncate(name, 2)]")))
    parts = {(f["partition"]["_kafka_timestamp_hour"], f["partition"]["name_trunc_2"])
             for f in env.catalog.load_table(ident).inspect.files().to_pylist()}
    hour = int(DAY0.timestamp()) // 3600
    assert parts == {(hour, "ab"), (hour, "cd"), (hour, None)}
    got, m = scan_metrics(env, "SELECT id FROM floe.layout.nested WHERE name IS NULL")
    assert sorted(r["id"] for r in got) == [0, 4, 8, 12, 16]
    assert (m["resultDataFiles"], m["skippedDataFiles"]) == (1, 2)
    got, m = scan_metrics(env, "SELECT count(*) AS n FROM floe.layout.nested "
                               "WHERE _kafka.timestamp >= TIMESTAMP '2026-03-01 12:00:00'")
    assert got == [{"n": 20}]
