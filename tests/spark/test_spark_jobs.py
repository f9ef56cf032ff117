"""Spark on the broker's catalog: both sides see one catalog, and the maintenance jobs keep the
rows, the broker's offsets and the broker's ability to commit.

One SparkSession (conftest.spark_env) for all; every test uses its own tables."""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from spark_compaction import compact, jobs, sql
from spark_compaction.names import TableRef
from spark_compaction.policy import Thresholds
from spark_compaction.tables import list_tables
from tabletopic.contract import OFFSETS, table_offsets
from tests.spark.conftest import SparkEnv
from tests.spark.tables import (
    broker_commit,
    create_topic_table,
    data_files,
    expected_keys,
    fill,
    rows,
)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    # pyspark leaves sockets to the garbage collector (see conftest.collect_garbage)
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
ROOT = Path(__file__).resolve().parents[2]


def offsets_of(env: SparkEnv, ident: tuple[str, str]) -> dict[int, int]:
    return table_offsets(env.catalog.load_table(ident))


def spark_count(env: SparkEnv, ident: tuple[str, str]) -> int:
    ref = TableRef((ident[0],), ident[1])
    return int(env.spark.sql(f"SELECT count(*) AS n FROM {ref.sql}").collect()[0]["n"])


def assert_catalog_writable(env: SparkEnv) -> None:
    """Another process (the broker) can still write the SQLite catalog: Spark holds no lock."""
    con = sqlite3.connect(env.data_dir / "catalog.db", timeout=2, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("UPDATE iceberg_tables SET catalog_name = catalog_name WHERE 0")
        con.execute("COMMIT")
    finally:
        con.close()


def test_one_catalog_for_pyiceberg_and_spark(spark_env: SparkEnv) -> None:
    env, ident = spark_env, ("default", "shared")
    create_topic_table(env.catalog, *ident, topic="shared")
    fill(env.catalog, ident, commits=3)
    assert spark_count(env, ident) == 15
    assert_catalog_writable(env)  # Spark's JdbcCatalog must not keep SQLite read-locked
    # a Spark commit, then the broker's next commit on top of it
    env.spark.sql("ALTER TABLE floe.default.shared SET TBLPROPERTIES ('spark.was.here'='1')")
    broker_commit(env.catalog, ident, 0, 5)
    table = env.catalog.load_table(ident)
    assert table.properties["spark.was.here"] == "1"
    assert table_offsets(table) == {0: 15, 1: 5}
    assert spark_count(env, ident) == 20
    assert set(rows(env.catalog, ident)) == expected_keys({0: 15, 1: 5})
    assert_catalog_writable(env)
    # one row per table, under the broker's catalog name
    con = sqlite3.connect(env.data_dir / "catalog.db")
    names = con.execute("SELECT catalog_name, table_namespace FROM iceberg_tables "
                        "WHERE table_name = 'shared'").fetchall()
    con.close()
    assert names == [("floe", "default")]
    listed = {str(r) for r in list_tables(env.spark)}
    assert "default.shared" in listed  # it has floe.topic
    # a table Spark creates is a table for pyiceberg too
    env.spark.sql("CREATE TABLE floe.default.from_spark (id BIGINT) USING iceberg")
    env.spark.sql("INSERT INTO floe.default.from_spark VALUES (1), (2)")
    assert env.catalog.load_table(("default", "from_spark")).scan().to_arrow().num_rows == 2
    assert "default.from_spark" not in {str(r) for r in list_tables(env.spark)}
    assert_catalog_writable(env)


def test_rewrite_data_files_keeps_rows_and_offsets(spark_env: SparkEnv) -> None:
    env, ident = spark_env, ("default", "small_files")
    create_topic_table(env.catalog, *ident, topic="small-files")
    fill(env.catalog, ident, commits=40)
    before_rows = rows(env.catalog, ident)
    before_offsets = env.catalog.load_table(ident).properties[OFFSETS]
    assert len(data_files(env.catalog, ident)) == 40

    r = jobs.rewrite_data_files(env.spark, "default.small_files")

    assert r["data_files_before"] == 40 and r["rewritten_data_files"] == 40
    assert r["data_files_after"] == len(data_files(env.catalog, ident)) <= 2
    assert rows(env.catalog, ident) == before_rows  # same rows, same values, no duplicate
    table = env.catalog.load_table(ident)
    assert table.properties[OFFSETS] == before_offsets
    assert table.current_snapshot().summary.operation.value == "replace"
    # the broker goes on committing after the compaction
    broker_commit(env.catalog, ident, 1, 7)
    after = rows(env.catalog, ident)
    assert set(after) == expected_keys({0: 100, 1: 107})
    assert spark_count(env, ident) == 207
    assert_catalog_writable(env)


def test_rewrite_sorted_by_configured_columns(spark_env: SparkEnv) -> None:
    env, ident = spark_env, ("default", "sorted")
    create_topic_table(env.catalog, *ident, topic="sorted")
    fill(env.catalog, ident, commits=8, partitions=2)
    env.catalog.load_table(ident).transaction().set_properties(
        {jobs.SORT_PROPERTY: "_kafka.partition DESC, _kafka.offset"}).commit_transaction()

    r = jobs.rewrite_data_files(env.spark, "default.sorted")

    assert r["strategy"] == "sort" and r["data_files_after"] == 1
    table = env.catalog.load_table(ident)
    keys = [(x["partition"], x["offset"]) for x in
            table.scan(selected_fields=("_kafka",)).to_arrow().column("_kafka").to_pylist()]
    assert keys == sorted(keys, key=lambda k: (-k[0], k[1]))
    assert set(keys) == expected_keys({0: 20, 1: 20})


def test_rewrite_while_the_broker_commits(spark_env: SparkEnv) -> None:
    """The broker commits several times a second (table.topic.commit.interval.ms=300) during
    the whole rewrite: the rewrite's commit gets through (Iceberg's retries, then ours) and
    the broker's commits all land."""
    env, ident = spark_env, ("default", "busy")
    create_topic_table(env.catalog, *ident, topic="busy")
    fill(env.catalog, ident, commits=20)
    stop = threading.Event()
    errors: list[BaseException] = []
    commits = [0]

    def broker() -> None:
        try:
            while not stop.is_set() and commits[0] < 300:
                broker_commit(env.catalog, ident, commits[0] % 2, 3)
                commits[0] += 1
                stop.wait(0.3)
        except BaseException as e:  # surfaced below
            errors.append(e)

    t = threading.Thread(target=broker)
    t.start()
    try:
        time.sleep(0.5)
        r = jobs.rewrite_data_files(env.spark, "default.busy")
        during = commits[0]
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert r["rewritten_data_files"] >= 20 and during > 1 and r["attempts"] >= 1
    offsets = offsets_of(env, ident)
    assert sum(offsets.values()) == 20 * 5 + commits[0] * 3
    assert set(rows(env.catalog, ident)) == expected_keys(offsets)


def test_rewrite_manifests(spark_env: SparkEnv) -> None:
    env, ident = spark_env, ("default", "manifests")
    create_topic_table(env.catalog, *ident, topic="manifests")
    fill(env.catalog, ident, commits=12)
    r = jobs.rewrite_manifests(env.spark, "default.manifests")
    assert r["manifests_before"] == 12 and r["manifests_after"] < 12
    assert set(rows(env.catalog, ident)) == expected_keys({0: 30, 1: 30})


def test_expire_snapshots_keeps_current_recent_and_offsets(spark_env: SparkEnv) -> None:
    env, ident = spark_env, ("default", "expiring")
    create_topic_table(env.catalog, *ident, topic="expiring")
    fill(env.catalog, ident, commits=30)
    jobs.rewrite_data_files(env.spark, "default.expiring")
    table = env.catalog.load_table(ident)
    current, offsets = table.current_snapshot().snapshot_id, table.properties[OFFSETS]
    before = rows(env.catalog, ident)

    # everything is younger than a day: nothing goes
    kept = jobs.expire_snapshots(env.spark, "default.expiring", max_age=dt.timedelta(days=1),
                                 retain_last=1)
    assert kept["snapshots_expired"] == 0 and kept["snapshots_after"] == 31

    # older than "now", but the last 5 stay
    r = jobs.expire_snapshots(env.spark, "default.expiring", max_age=dt.timedelta(0),
                              retain_last=5)
    assert r["snapshots_before"] == 31 and r["snapshots_after"] == 5
    assert r["snapshots_expired"] == 26
    table = env.catalog.load_table(ident)
    assert table.current_snapshot().snapshot_id == current
    assert table.properties[OFFSETS] == offsets  # the broker's position survives
    assert len(table.metadata.snapshots) == 5
    assert rows(env.catalog, ident) == before

    # down to the current snapshot only; the small files nothing references any more go
    r = jobs.expire_snapshots(env.spark, "default.expiring", max_age=dt.timedelta(0),
                              retain_last=1)
    assert r["snapshots_after"] == 1 and r["deleted_data_files"] == 30
    table = env.catalog.load_table(ident)
    assert table.current_snapshot().snapshot_id == current
    assert rows(env.catalog, ident) == before
    on_disk = list((Path(table.location().removeprefix("file://")) / "data").glob("*.parquet"))
    assert len(on_disk) == 1
    broker_commit(env.catalog, ident, 0, 5)
    assert offsets_of(env, ident) == {0: 80, 1: 75}
    with pytest.raises(ValueError):
        jobs.expire_snapshots(env.spark, "default.expiring", retain_last=0)


def test_remove_orphan_files_respects_the_safety_age(spark_env: SparkEnv) -> None:
    env, ident = spark_env, ("default", "orphans")
    create_topic_table(env.catalog, *ident, topic="orphans")
    fill(env.catalog, ident, commits=6)
    jobs.rewrite_data_files(env.spark, "default.orphans")  # Spark-written files (file:/...)
    fill(env.catalog, ident, commits=2)  # and pyiceberg-written ones (file:///...)
    before = rows(env.catalog, ident)
    location = Path(env.catalog.load_table(ident).location().removeprefix("file://"))
    # every live file looks old: age alone must never make a referenced file an orphan
    three_days_ago = time.time() - 3 * 86400
    for p in location.rglob("*"):
        if p.is_file():
            os.utime(p, (three_days_ago, three_days_ago))
    old_data, old_meta = location / "data" / "old-orphan.parquet", location / "metadata" / "x.avro"
    fresh = location / "data" / "in-flight.parquet"  # e.g. the broker's uncommitted file
    for p in (old_data, old_meta):
        p.write_bytes(b"orphan")
        os.utime(p, (three_days_ago, three_days_ago))
    fresh.write_bytes(b"being written")

    dry = jobs.remove_orphan_files(env.spark, "default.orphans", dry_run=True)
    found = {Path(f.removeprefix("file:").lstrip("/")).name for f in dry["orphan_files"]}
    assert found == {"old-orphan.parquet", "x.avro"} and dry["orphans_removed"] == 0
    assert old_data.exists()

    r = jobs.remove_orphan_files(env.spark, "default.orphans")
    assert r["orphans_removed"] == 2
    assert not old_data.exists() and not old_meta.exists()
    assert fresh.exists()
    assert rows(env.catalog, ident) == before
    assert spark_count(env, ident) == len(before)
    broker_commit(env.catalog, ident, 0, 1)
    with pytest.raises(ValueError, match="below"):
        jobs.remove_orphan_files(env.spark, "default.orphans", min_age=dt.timedelta(hours=1))


def test_watch_compacts_only_table_topics_past_thresholds(spark_env: SparkEnv) -> None:
    env = spark_env
    create_topic_table(env.catalog, "watched", "busy", topic="busy")
    fill(env.catalog, ("watched", "busy"), commits=12)
    create_topic_table(env.catalog, "watched", "quiet", topic="quiet")
    fill(env.catalog, ("watched", "quiet"), commits=2)
    create_topic_table(env.catalog, "watched", "not_a_topic", topic=None)
    fill(env.catalog, ("watched", "not_a_topic"), commits=12)

    results = compact.watch(
        env.spark,
        jobs.JobOptions(),
        Thresholds(min_small_files=10, orphan_interval_s=1e9),
        jobs=["rewrite_data_files", "rewrite_manifests", "expire_snapshots"],
        rounds=1,
        namespaces=[("watched",)],
    )
    done = {(r["table"], r["job"]) for r in results}
    assert done == {("watched.busy", "rewrite_data_files")}
    assert all("error" not in r for r in results)
    assert len(data_files(env.catalog, ("watched", "busy"))) == 1
    assert len(data_files(env.catalog, ("watched", "quiet"))) == 2
    assert len(data_files(env.catalog, ("watched", "not_a_topic"))) == 12
    assert_catalog_writable(env)


def test_sql_json_output(spark_env: SparkEnv, capsys: pytest.CaptureFixture[str]) -> None:
    env, ident = spark_env, ("default", "sql_json")
    create_topic_table(env.catalog, *ident, topic="sql-json")
    fill(env.catalog, ident, commits=2, per_commit=2)
    args = Namespace(query="SELECT _kafka.partition AS p, _kafka.offset AS o, _kafka.key AS k, "
                           "text FROM default.sql_json ORDER BY p, o",
                     json=True, jsonl=False, max_rows=10)
    assert sql.run_sql(env.spark, args) == 0
    got: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    assert got[0] == {"p": 0, "o": 0, "k": "azA=", "text": "r0-0"}  # key b"k0", base64
    assert len(got) == 4
    args = Namespace(query="SELECT text, n FROM default.sql_json ORDER BY n, text",
                     json=False, jsonl=False, max_rows=3)
    assert sql.run_sql(env.spark, args) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[:3] == ["text | n", "-----+--", "r0-0 | 0"]
    assert "more not shown" in err


def floe(*args: str, env_vars: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`floe ARGS` in a new process (through broker.cli once it carries the Spark commands)."""
    from broker import cli as broker_cli

    wired = "spark_compaction" in Path(broker_cli.__file__).read_text()
    module = "broker.cli" if wired else "spark_compaction.cli"
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env={**os.environ, **(env_vars or {})})


def test_floe_sql_command_prints_the_count(spark_env: SparkEnv) -> None:
    env, ident = spark_env, ("default", "sql_cli")
    create_topic_table(env.catalog, *ident, topic="sql-cli")
    fill(env.catalog, ident, commits=3, per_commit=4)
    # the data dir from the environment, like the broker's FLOE_DATA_DIR
    p = floe("sql", "SELECT count(*) AS n FROM floe.default.sql_cli",
             env_vars={"FLOE_DATA_DIR": str(env.data_dir)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == [" n", "--", "12"]  # numbers right-aligned
    bad = floe("sql", "SELECT * FROM floe.default.nope", "--data-dir", str(env.data_dir))
    assert bad.returncode == 1 and "TABLE_OR_VIEW_NOT_FOUND" in bad.stderr


def test_compact_command_on_a_postgresql_catalog(tmp_path: Path, pg_url: str) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    from tabletopic.catalog import open_catalog

    catalog = open_catalog(pg_url, (tmp_path / "warehouse").as_uri())
    assert isinstance(catalog, SqlCatalog)
    ident = ("default", "pg_table")
    create_topic_table(catalog, *ident, topic="pg")
    fill(catalog, ident, commits=8)
    before = rows(catalog, ident)
    p = floe("compact", "--table", "default.pg_table", "--catalog", pg_url,
             "--warehouse", (tmp_path / "warehouse").as_uri(),
             "--jobs", "rewrite_data_files,expire_snapshots", "--retain-last", "2",
             "--snapshot-max-age", "0s", "--quick-start")
    assert p.returncode == 0, p.stderr[-3000:]
    results = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["job"] for r in results] == ["rewrite_data_files", "expire_snapshots"]
    assert results[0]["data_files_before"] == 8 and results[0]["data_files_after"] == 1
    assert results[1]["snapshots_after"] == 2
    assert rows(catalog, ident) == before
    broker_commit(catalog, ident, 0, 5)
    assert table_offsets(catalog.load_table(ident)) == {0: 25, 1: 20}


def test_compaction_while_a_live_broker_writes_the_table(spark_env: SparkEnv) -> None:
    """The real broker writing a table topic into the same catalog while Spark compacts,
    rewrites manifests and expires snapshots: every acknowledged record lands exactly once."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.brokerproc import BrokerProcess

    env, ident = spark_env, ("default", "live_events")
    broker = BrokerProcess(data_dir=env.data_dir).start()  # the catalog Spark already uses
    acked: set[tuple[int, int]] = set()
    errors: list[str] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {"table.topic.enable": "true", "table.topic.convert.value.type": "json",
                  "table.topic.commit.interval.ms": "200"}
        topic = NewTopic("live.events", 2, 1, config=config)
        admin.create_topics([topic])["live.events"].result(10)

        def produce() -> None:
            p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})

            def done(err: Any, msg: Any) -> None:
                if err is None:
                    acked.add((msg.partition(), msg.offset()))
                else:
                    errors.append(str(err))

            for batch in range(40):
                for i in range(50):
                    n = batch * 50 + i
                    p.produce("live.events", json.dumps({"n": n}).encode(), partition=n % 2,
                              on_delivery=done)
                p.flush(10)
                time.sleep(0.15)

        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for a few of the broker's commits
            try:
                if len(data_files(env.catalog, ident)) >= 6:
                    break
            except Exception:  # the table does not exist yet
                pass
            time.sleep(0.2)
        results = [
            jobs.rewrite_data_files(env.spark, "default.live_events"),
            jobs.rewrite_manifests(env.spark, "default.live_events"),
            jobs.expire_snapshots(env.spark, "default.live_events", max_age=dt.timedelta(0),
                                  retain_last=3),
        ]
        producer.join(60)
        assert not errors and len(acked) == 2000
        deadline = time.monotonic() + 30
        got: dict[tuple[int, int], dict[str, Any]] = {}
        while time.monotonic() < deadline:
            got = rows(env.catalog, ident)  # fails on a duplicate
            if len(got) >= len(acked):
                break
            time.sleep(0.3)
        assert set(got) == acked
        assert offsets_of(env, ident) == {0: 1000, 1: 1000}
        assert results[0]["rewritten_data_files"] >= 6
        # what the expiry itself did: the broker commits every 200 ms meanwhile, so the table
        # may hold more snapshots after the call than before it (13 against 12, seen in CI)
        assert results[2]["deleted_manifest_lists"] >= 1, results[2]
        assert "Traceback" not in broker.log(), broker.log()[-3000:]
        final = jobs.rewrite_data_files(env.spark, "default.live_events")
        assert final["data_files_after"] <= 2
        assert set(rows(env.catalog, ident)) == acked
    finally:
        broker.stop()
