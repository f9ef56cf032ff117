"""A table writer taken up behind the log's end reads its partitions one after the other when
the backlog fits one hand-in, and writes each caught-up partition's Parquet while the next is
read (tabletopic.writer `_write_ahead`); the hand-in takes those files. The table then holds
every record exactly once, in one commit. A write ahead that fails costs nothing: the
hand-in writes those tables again. A backlog larger than one hand-in is read partition by
partition in turn, as before. Real storage (file objects, SQLite), a real SQLite catalog and
file warehouse; the failure is the Parquet write raising once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog

import tabletopic.writer as writer_module
from broker.protocol.recordcodec import encode_batch
from broker.storage import Storage
from tabletopic.contract import table_offsets
from tabletopic.writer import TableWriter
from tests.tablewriter import open_writer

TOPIC = "ahead"
IDENT = ("default", TOPIC)
CONFIG: dict[str, str | None] = {
    "table.topic.enable": "true",
    "table.topic.convert.value.type": "json",
    "table.topic.commit.interval.ms": "60000",  # far longer than the test
}


@dataclass
class Setup:
    storage: Storage
    catalog: Catalog
    writer: TableWriter


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    storage, catalog, writer = await open_writer(tmp_path, TOPIC)
    try:
        yield Setup(storage, catalog, writer)
    finally:
        await storage.close()


async def backlog_written(s: Setup, per_partition: int, partitions: int = 3,
                          config: dict[str, str | None] | None = None) -> list[tuple[int, int]]:
    """Append a backlog to every partition, run the writer until the table holds it, and
    return the (partition, offset) of every row of the table."""
    await s.storage.create_topic(TOPIC, partitions, {**CONFIG, **(config or {})})
    for start in range(0, per_partition, 20):  # batches of 20 records
        for p in range(partitions):
            rows = [(None, f'{{"k": {k}, "p": {p}}}'.encode(), [])
                    for k in range(start, start + 20)]
            await s.storage.append(TOPIC, p, encode_batch(rows, 1_700_000_000_000))
    task = asyncio.create_task(s.writer.run())

    async def offsets() -> dict[int, int]:
        with contextlib.suppress(Exception):
            return table_offsets(await asyncio.to_thread(s.catalog.load_table, IDENT))
        return {}

    try:
        began = time.monotonic()
        want = dict.fromkeys(range(partitions), per_partition)
        while await offsets() != want and time.monotonic() - began < 15:
            await asyncio.sleep(0.05)
        assert await offsets() == want, s.writer.status()
    finally:
        s.writer.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    rows = s.catalog.load_table(IDENT).scan().to_arrow().column("_kafka").to_pylist()
    return sorted((r["partition"], r["offset"]) for r in rows)


async def test_a_backlog_written_ahead_lands_once(setup: Setup) -> None:
    rows = await backlog_written(setup, 100)
    assert rows == [(p, o) for p in range(3) for o in range(100)]  # each record exactly once
    assert setup.writer.writes_ahead == 2  # partitions 0 and 1, while 1 and 2 were read
    assert setup.writer.status()["writes_ahead"] == 2
    assert setup.writer.commits == 1


async def test_a_failed_write_ahead_is_written_again_by_the_hand_in(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    real: Callable[..., Any] = writer_module.write_data_files
    calls: list[int] = []

    def failing_once(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the first write ahead
            raise OSError("warehouse unavailable (injected)")
        return real(*args)

    monkeypatch.setattr(writer_module, "write_data_files", failing_once)
    rows = await backlog_written(setup, 100)
    assert rows == [(p, o) for p in range(3) for o in range(100)]  # nothing lost, nothing twice
    assert len(calls) == 4  # the failed write ahead, the other one, partition 0 again, 2
    # the failure was a write ahead's, absorbed by the hand-in: no step failed and was retried
    assert setup.writer.writes_ahead == 2
    assert setup.writer.retries["error"] == 0, setup.writer.last_error
    assert setup.writer.commits == 1


async def test_a_backlog_beyond_one_hand_in_is_read_in_turn(setup: Setup) -> None:
    rows = await backlog_written(setup, 100, config={"table.topic.commit.max.records": "150"})
    assert rows == [(p, o) for p in range(3) for o in range(100)]
    assert setup.writer.writes_ahead == 0


async def test_a_new_table_caps_parquet_dictionaries_at_256_kib(setup: Setup) -> None:
    """The table floe creates caps Parquet's dictionary page at 256 KiB (Iceberg's default,
    2 MiB, had Arrow hold ~50 MiB more per partition's write of a 135k-row backlog,
    benchmarks/README.md, tablebacklog): the property pyiceberg's writer and Spark's read.
    Arrow checks the cap every `write.parquet.page-row-limit` rows (20,000), so a file this
    small keeps its whole dictionary either way; every row lands as before."""
    rows = await backlog_written(setup, 100, partitions=1)
    assert rows == [(0, o) for o in range(100)]
    table = setup.catalog.load_table(IDENT)
    assert table.properties["write.parquet.dict-size-bytes"] == str(256 * 1024)
    assert table.properties["floe.topic"] == TOPIC  # with floe's own
