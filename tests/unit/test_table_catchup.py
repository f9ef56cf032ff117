"""A table topic's writer that takes its partitions up behind the log's end (here: a table
switched on over a backlog) hands its rows in as soon as it has read up to the end, and the
coordinator commits them at once instead of at the next commit interval; after that, rows wait
for the interval as before."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from broker.protocol.recordcodec import encode_batch
from broker.storage import Storage
from tabletopic.contract import table_offsets
from tests.tablewriter import open_writer

TOPIC = "backlog"
CONFIG: dict[str, str | None] = {
    "table.topic.enable": "true",
    "table.topic.convert.value.type": "json",
    "table.topic.commit.interval.ms": "60000",  # far longer than the test
}


async def append(storage: Storage, partition: int, start: int, n: int) -> None:
    rows = [(None, f'{{"k": {k}, "p": {partition}}}'.encode(), []) for k in range(start, start + n)]
    await storage.append(TOPIC, partition, encode_batch(rows, 1_700_000_000_000))


async def test_a_backlog_is_committed_once_read_not_at_the_next_interval(
        tmp_path: Path) -> None:
    storage, catalog, writer = await open_writer(tmp_path, TOPIC)
    task: asyncio.Task[None] | None = None
    ident = ("default", TOPIC)

    async def offsets() -> dict[int, int]:
        with contextlib.suppress(Exception):
            return table_offsets(await asyncio.to_thread(catalog.load_table, ident))
        return {}

    try:
        await storage.create_topic(TOPIC, 2, CONFIG)
        for b in range(5):  # the backlog: 5 batches of 20 records in each partition
            for p in (0, 1):
                await append(storage, p, b * 20, 20)
        began = time.monotonic()
        task = asyncio.create_task(writer.run())
        while await offsets() != {0: 100, 1: 100} and time.monotonic() - began < 15:
            await asyncio.sleep(0.05)
        assert await offsets() == {0: 100, 1: 100}, writer.status()
        assert writer.commits == 1
        rows = catalog.load_table(ident).scan().to_arrow().column("_kafka").to_pylist()
        assert sorted((r["partition"], r["offset"]) for r in rows) == \
            [(p, o) for p in (0, 1) for o in range(100)]
        # caught up: new rows wait for the next request (a minute away), as before
        await append(storage, 0, 100, 3)
        await asyncio.sleep(1.5)
        assert writer.parts[0].read_next == 103
        assert await offsets() == {0: 100, 1: 100}
        assert writer.commits == 1
    finally:
        writer.stop()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await storage.close()
