"""Local warehouse durability, and the warehouse URL's way to pyiceberg's FileIO.

What must hold: a table-topic commit through the broker's catalog (open_catalog, then the
writer's commit_offsets) fsyncs every file the committed table metadata names (data files,
manifests, manifest list, the metadata file) and their directories before the catalog points
at them; an S3 warehouse URL's endpoint, region and path style reach the FileIO, and its
query is not part of the table location."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from broker.config import load_settings
from tabletopic.catalog import open_catalog
from tabletopic.commit import commit_offsets
from tabletopic.config import ORPHAN_MIN_AGE_S
from tabletopic.fileio import DurableFileIO
from tabletopic.warehouse import parse_warehouse

SCHEMA = pa.schema([pa.field("offset", pa.int64())])


def test_commits_fsync_every_file_before_the_catalog_points_at_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cat = open_catalog(f"sqlite:///{tmp_path}/c.db", (tmp_path / "wh").as_uri())
    cat.create_namespace("ns")
    cat.create_table(("ns", "t"), schema=SCHEMA)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    commit_offsets(
        cat, ("ns", "t"), "t", pa.table({"offset": [0, 1]}, schema=SCHEMA), {0: 0}, {0: 2}
    )
    commit_offsets(cat, ("ns", "t"), "t", None, {0: 2}, {0: 3})  # all-DLQ: a snapshot too
    monkeypatch.undo()
    t = cat.load_table(("ns", "t"))
    assert isinstance(t.io, DurableFileIO)
    files = {t.metadata_location}
    for snap in t.snapshots()[-2:]:
        files.add(snap.manifest_list)
        for m in snap.manifests(t.io):
            files.add(m.manifest_path)
            files.update(e.data_file.file_path for e in m.fetch_manifest_entry(t.io))
    paths = {f.removeprefix("file://") for f in files}
    assert len(paths) == 5  # metadata, 2 manifest lists, a manifest, a data file
    assert paths <= set(synced), f"not fsynced: {sorted(paths - set(synced))}"
    assert {os.path.dirname(p) for p in paths} <= set(synced), "directories not fsynced"


def test_s3_warehouse_url_reaches_the_fileio() -> None:
    wh = parse_warehouse(
        "s3://bkt/tables/?endpoint=http://127.0.0.1:9000&region=eu-west-3&path_style=true",
        environ={},
    )
    assert wh.location == "s3://bkt/tables"
    props = wh.fileio_properties()
    assert props["s3.endpoint"] == "http://127.0.0.1:9000"
    assert props["s3.region"] == "eu-west-3"
    assert props["s3.force-virtual-addressing"] == "false"
    assert props["py-io-impl"] == "tabletopic.fileio.DurableFileIO"
    java = wh.java_properties()
    assert java["s3.endpoint"] == "http://127.0.0.1:9000"
    assert java["s3.path-style-access"] == "true" and java["client.region"] == "eu-west-3"
    # no region in the URL: the AWS environment's, else us-east-1 with an endpoint
    assert parse_warehouse("s3://b?endpoint=http://h:1", {"AWS_REGION": "ap-south-1"}).s3
    assert (
        parse_warehouse("s3://b?endpoint=http://h:1", {}).fileio_properties()["s3.region"]
        == "us-east-1"
    )
    assert "s3.endpoint" not in parse_warehouse("s3://b/p", {}).fileio_properties()
    with pytest.raises(ValueError, match="unknown S3 URL parameter"):
        parse_warehouse("s3://b/p?endpiont=http://h:1", {})
    with pytest.raises(ValueError):
        parse_warehouse("file:///x?endpoint=http://h:1", {})
    assert parse_warehouse("file:///x/wh/", {}).location == "file:///x/wh"
    assert parse_warehouse("/x/wh", {}).location == "file:///x/wh"


def test_default_orphan_age_outlasts_any_commit() -> None:
    """Files a Spark rewrite (or any writer) wrote but has not committed yet are protected
    only by the age; the default is Iceberg's own, three days."""
    settings = load_settings({}, environ={})
    assert settings.table_orphan_min_age_ms == 3 * 24 * 3600 * 1000
    assert ORPHAN_MIN_AGE_S == 3 * 24 * 3600
