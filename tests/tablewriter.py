"""A table topic's writer on real local parts, for the writer's unit tests: file objects and
SQLite metadata (broker.storage.Storage), a SQLite catalog and a file warehouse."""

from __future__ import annotations

from pathlib import Path

from pyiceberg.catalog import Catalog

from broker.metadata.tablework import TableWork
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import open_object_store
from tabletopic.catalog import open_catalog
from tabletopic.writer import TableWriter


async def open_writer(tmp_path: Path, topic: str) -> tuple[Storage, Catalog, TableWriter]:
    """Storage (opened: the caller closes it), catalog and a writer of `topic` on node 0."""
    storage = Storage(open_object_store((tmp_path / "objects").as_uri()),
                      SqliteMetadataStore(tmp_path / "meta.db"), WalSettings(flush_interval_ms=1))
    await storage.open()
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    work = TableWork(storage.meta)
    await work.open()
    return storage, catalog, TableWriter(topic, storage, catalog, work, node_id=0,
                                         orphan_min_age_s=3600)
