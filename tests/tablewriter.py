"""A TableWriter on real parts, for the table writer's unit tests: a Storage on file objects
and a SQLite metadata database, a SQLite Iceberg catalog with a file warehouse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from pyiceberg.catalog import Catalog

from broker.metadata.tablework import TableWork
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import open_object_store
from tabletopic.catalog import open_catalog
from tabletopic.writer import TableWriter


@dataclass
class WriterSetup:
    storage: Storage
    catalog: Catalog
    writer: TableWriter


@asynccontextmanager
async def table_writer(tmp_path: Path, topic: str) -> AsyncIterator[WriterSetup]:
    """The writer of `topic` (not started; the topic is not created), closed after."""
    storage = Storage(open_object_store((tmp_path / "objects").as_uri()),
                      SqliteMetadataStore(tmp_path / "meta.db"), WalSettings(flush_interval_ms=1))
    await storage.open()
    try:
        catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
        work = TableWork(storage.meta)
        await work.open()
        writer = TableWriter(topic, storage, catalog, work, node_id=0, orphan_min_age_s=3600)
        yield WriterSetup(storage, catalog, writer)
    finally:
        await storage.close()
