"""Iceberg warehouses for table tests: a local directory, and a bucket on moto's S3 server
reached through the warehouse URL's `?endpoint=&region=&path_style=` exactly like the broker
does (tabletopic.catalog.open_catalog). Tests that delete table files run on both."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import PyArrowFileIO

from tabletopic.catalog import open_catalog
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV

_buckets = itertools.count()


@dataclass
class Warehouse:
    kind: str  # file | s3
    url: str  # the warehouse URL as the broker takes it
    catalog_url: str
    catalog: Catalog  # opened with open_catalog, namespace "ns" created
    alias: str  # another spelling of the warehouse location (same files): s3a://, a symlink

    def write_parquet(self, location: str, table: pa.Table) -> None:
        """A Parquet file at `location`, written directly (no commit)."""
        io = PyArrowFileIO(self.catalog.properties)
        with io.new_output(location).create(overwrite=True) as f:
            pq.write_table(table, f)

    def exists(self, location: str) -> bool:
        return bool(PyArrowFileIO(self.catalog.properties).new_input(location).exists())


def s3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials for moto, in this process's environment (the AWS SDK under pyarrow
    reads them there); a developer's own AWS settings do not apply."""
    for k, v in TEST_AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in UNSET_AWS_ENV:
        monkeypatch.delenv(k, raising=False)


def new_bucket(endpoint: str, prefix: str = "wh") -> str:
    bucket = f"{prefix}-{os.getpid()}-{next(_buckets)}"
    c = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    c.create_bucket(Bucket=bucket)
    c.close()
    return bucket


@pytest.fixture(params=["file", "s3"])
def warehouse(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Warehouse]:
    if request.param == "file":
        root = tmp_path / "warehouse"
        root.mkdir()
        (tmp_path / "alias").symlink_to(root)
        url = root.as_uri()
        alias = (tmp_path / "alias").as_uri()
    else:
        s3_env(monkeypatch)
        endpoint = request.getfixturevalue("s3_server")
        bucket = new_bucket(endpoint)
        url = f"s3://{bucket}/tables?endpoint={endpoint}&region=us-east-1&path_style=true"
        alias = f"s3a://{bucket}/tables"
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    cat = open_catalog(catalog_url, url)
    cat.create_namespace("ns")
    yield Warehouse(request.param, url, catalog_url, cat, alias)
