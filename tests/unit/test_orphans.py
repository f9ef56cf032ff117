"""The orphan sweep deletes data, so every case runs on a local (file://) warehouse and on an S3
warehouse (moto's server, reached through the warehouse URL's endpoint like a broker would).

What must hold: files any snapshot references survive a sweep of any age (0 included) and the
table reads the same rows afterwards; files nobody references (a Parquet file written for a
commit that never happened) are deleted once old enough, young ones stay; when references and
listing disagree (files referenced under another spelling of their location) nothing at all
is deleted and an error is logged."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

from tabletopic.catalog import open_catalog
from tabletopic.orphans import remove_orphan_files
from tests.warehouses import Warehouse

SCHEMA = pa.schema([pa.field("a", pa.int64())])


def make_table(wh: Warehouse) -> Table:
    t = wh.catalog.create_table("ns.t", schema=SCHEMA)
    t.append(pa.table({"a": [1, 2]}, schema=SCHEMA))
    t.append(pa.table({"a": [3]}, schema=SCHEMA))
    return wh.catalog.load_table("ns.t")


def data_files(t: Table) -> set[str]:
    return set(t.inspect.all_files().column("file_path").to_pylist())


def test_live_files_survive_a_sweep_of_age_zero(warehouse: Warehouse) -> None:
    t = make_table(warehouse)
    live = data_files(t)
    assert len(live) == 2
    assert remove_orphan_files(t, min_age_s=0) == []
    t = warehouse.catalog.load_table("ns.t")
    assert sorted(t.scan().to_arrow().column("a").to_pylist()) == [1, 2, 3]
    assert data_files(t) == live
    assert all(t.io.new_input(p).exists() for p in live)


def test_files_of_a_commit_that_never_happened_go_once_old_enough(warehouse: Warehouse) -> None:
    t = make_table(warehouse)
    orphan = f"{t.location()}/data/never-committed.parquet"
    warehouse.write_parquet(orphan, pa.table({"a": [9, 9]}, schema=SCHEMA))
    assert remove_orphan_files(t, min_age_s=3600) == []  # too young: stays
    assert t.io.new_input(orphan).exists()
    removed = remove_orphan_files(t, min_age_s=0)
    assert removed == [orphan]
    assert not t.io.new_input(orphan).exists()
    t = warehouse.catalog.load_table("ns.t")
    assert sorted(t.scan().to_arrow().column("a").to_pylist()) == [1, 2, 3]


def test_files_of_waiting_file_sets_stay_whatever_their_age(warehouse: Warehouse) -> None:
    """A worker's files waiting for the coordinator's commit (tabletopic.coordinator) are not
    referenced by the table yet: kept by name, even by a sweep of age zero."""
    t = make_table(warehouse)
    waiting = f"{t.location()}/data/waiting-for-a-commit.parquet"
    orphan = f"{t.location()}/data/never-committed.parquet"
    for path in (waiting, orphan):
        warehouse.write_parquet(path, pa.table({"a": [9]}, schema=SCHEMA))
    assert remove_orphan_files(t, min_age_s=0, keep=frozenset({waiting})) == [orphan]
    assert t.io.new_input(waiting).exists()
    assert remove_orphan_files(t, min_age_s=0) == [waiting]  # no longer waiting: an orphan


def test_old_file_goes_young_file_stays_by_modification_time(tmp_path: Path) -> None:
    cat = open_catalog(f"sqlite:///{tmp_path}/c.db", (tmp_path / "w").as_uri())
    cat.create_namespace("default")
    t = cat.create_table("default.t", schema=SCHEMA)
    t.append(pa.table({"a": [1, 2]}, schema=SCHEMA))
    data = Path(t.location().removeprefix("file://")) / "data"
    old, fresh = data / "orphan-old.parquet", data / "orphan-new.parquet"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    then = time.time() - 100
    os.utime(old, (then, then))
    removed = remove_orphan_files(t, min_age_s=50)
    assert removed == [old.as_uri()]
    assert fresh.exists() and t.scan().to_arrow().num_rows == 2


def test_references_spelled_differently_delete_nothing(
    warehouse: Warehouse, caplog: pytest.LogCaptureFixture
) -> None:
    """The table references its files through another spelling of the warehouse (s3a:// for
    s3://, a symlinked directory for the local one): the sweep must not take them, nor the
    real orphan next to them, for orphans; it deletes nothing and says why."""
    t = warehouse.catalog.create_table("ns.t", schema=SCHEMA)
    rel = t.location().split("/tables/", 1)[1] if warehouse.kind == "s3" else None
    base = (
        f"{warehouse.alias}/{rel}"
        if rel is not None
        else t.location().replace(warehouse.url, warehouse.alias, 1)
    )
    live = [f"{base}/data/added-{i}.parquet" for i in range(2)]
    for i, loc in enumerate(live):
        warehouse.write_parquet(loc, pa.table({"a": [10 + i]}, schema=SCHEMA))
    t.add_files(live)
    orphan = f"{t.location()}/data/never-committed.parquet"
    warehouse.write_parquet(orphan, pa.table({"a": [9]}, schema=SCHEMA))
    t = warehouse.catalog.load_table("ns.t")
    with caplog.at_level(logging.ERROR, logger="tabletopic.orphans"):
        assert remove_orphan_files(t, min_age_s=0) == []
    assert "not deleting anything" in caplog.text
    t = warehouse.catalog.load_table("ns.t")
    assert sorted(t.scan().to_arrow().column("a").to_pylist()) == [10, 11]
    assert t.io.new_input(orphan).exists()


def test_files_referenced_only_by_an_older_snapshot_stay(warehouse: Warehouse) -> None:
    """An overwrite replaces the table's files; the old ones are still referenced by the older
    snapshot (time travel, a reader mid-scan) and must survive until the snapshot expires."""
    t = make_table(warehouse)
    before = data_files(t)
    t.overwrite(pa.table({"a": [7]}, schema=SCHEMA))
    t = warehouse.catalog.load_table("ns.t")
    assert remove_orphan_files(t, min_age_s=0) == []
    assert all(t.io.new_input(p).exists() for p in before)
    old = t.metadata.snapshots[1].snapshot_id
    assert sorted(t.scan(snapshot_id=old).to_arrow().column("a").to_pylist()) == [1, 2, 3]


def test_files_spelled_the_spark_way_are_recognised(tmp_path: Path) -> None:
    """Spark (Hadoop paths) references local files as `file:/dir/x.parquet`, pyiceberg as
    `file:///dir/x.parquet`: the same file, so after a Spark rewrite the compacted files must
    survive while real orphans still go."""
    cat = open_catalog(f"sqlite:///{tmp_path}/c.db", (tmp_path / "w").as_uri())
    cat.create_namespace("default")
    t = cat.create_table("default.t", schema=SCHEMA)
    t.append(pa.table({"a": [1]}, schema=SCHEMA))
    data = Path(t.location().removeprefix("file://")) / "data"
    spark_file = f"file:{data}/spark-rewritten.parquet"
    pq.write_table(pa.table({"a": [2]}, schema=SCHEMA), data / "spark-rewritten.parquet")
    t.add_files([spark_file])
    orphan = data / "orphan.parquet"
    pq.write_table(pa.table({"a": [3]}, schema=SCHEMA), orphan)
    t = cat.load_table("default.t")
    assert remove_orphan_files(t, min_age_s=0) == [orphan.as_uri()]
    assert sorted(cat.load_table("default.t").scan().to_arrow().column("a").to_pylist()) == [1, 2]


def test_a_table_with_its_own_data_path(warehouse: Warehouse) -> None:
    """`write.data.path` moves the data files: the sweep looks there, keeps the live files and
    deletes the orphans next to them."""
    loc = f"{warehouse.catalog.properties['warehouse']}/elsewhere/t"
    t = warehouse.catalog.create_table("ns.t", schema=SCHEMA, properties={"write.data.path": loc})
    t.append(pa.table({"a": [1, 2]}, schema=SCHEMA))
    t = warehouse.catalog.load_table("ns.t")
    assert all(p.startswith(loc + "/") for p in data_files(t))
    orphan = f"{loc}/never-committed.parquet"
    warehouse.write_parquet(orphan, pa.table({"a": [9]}, schema=SCHEMA))
    assert remove_orphan_files(t, min_age_s=0) == [orphan]
    assert sorted(
        warehouse.catalog.load_table("ns.t").scan().to_arrow().column("a").to_pylist()
    ) == [1, 2]
