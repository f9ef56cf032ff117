"""A table topic's writer on a broker that stops leading its partition for a while (another
broker leads it, or the broker's lease lapsed while the metadata database was unreachable):
it drops the partition (and stops coordinating: partition 0), and once the partition is served
again it starts from the table's offsets and the table catches up with every record exactly
once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from broker.cluster import ClusterSettings
from broker.metadata.tablework import TableWork
from broker.protocol.recordcodec import encode_batch
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import open_object_store
from tabletopic.catalog import open_catalog
from tabletopic.contract import table_offsets
from tabletopic.writer import TableWriter

TOPIC = "ev"
CONFIG: dict[str, str | None] = {
    "table.topic.enable": "true",
    "table.topic.convert.value.type": "json",
    "table.topic.commit.interval.ms": "40",
}


async def append(storage: Storage, k: int) -> None:
    rows = [(f"k{k}".encode(), f'{{"k": {k}}}'.encode(), [])]
    await storage.append(TOPIC, 0, encode_batch(rows, 1_700_000_000_000))


async def test_the_writer_waits_out_a_lapsed_lease_and_catches_up(tmp_path: Path) -> None:
    storage = Storage(
        open_object_store((tmp_path / "objects").as_uri()),
        SqliteMetadataStore(tmp_path / "meta.db"),
        WalSettings(flush_interval_ms=1),
        ClusterSettings(node_id=1, heartbeat_interval_ms=600_000, session_timeout_ms=600_000),
    )
    await storage.open()
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    work = TableWork(storage.meta)
    await work.open()
    writer = TableWriter(TOPIC, storage, catalog, work, node_id=1, orphan_min_age_s=3600)
    task: asyncio.Task[None] | None = None
    ident = ("default", TOPIC)

    async def table_reaches(end: int) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                table = await asyncio.to_thread(catalog.load_table, ident)
                if table_offsets(table) == {0: end}:
                    return True
            await asyncio.sleep(0.05)
        return False

    try:
        await storage.create_topic(TOPIC, 1, CONFIG)
        task = asyncio.create_task(writer.run())
        for k in range(3):
            await append(storage, k)
        assert await table_reaches(3)
        storage.cluster._lease_until = 0.0  # as if the last heartbeat were too long ago
        deadline = time.monotonic() + 5  # a commit round under way ends first
        while (writer.parts or writer.coordinator.active) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not task.done(), "the writer gave up"
        assert not writer.parts, "the writer still writes a partition it does not serve"
        assert not writer.coordinator.active, "still coordinating without partition 0"
        await storage._sync()  # a heartbeat renews the lease: served again
        for k in range(3, 6):
            await append(storage, k)
        assert await table_reaches(6)
        table = catalog.load_table(ident)
        rows = table.scan().to_arrow().column("_kafka").to_pylist()
        assert sorted(r["offset"] for r in rows) == list(range(6))
    finally:
        writer.stop()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await storage.close()
