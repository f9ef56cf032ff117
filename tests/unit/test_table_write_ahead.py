"""A table writer with a backlog writes a partition's Parquet files while it reads on
(tabletopic.writer `_write_ahead`), and hands them in with the rest: the table then holds
every record of the topic exactly once. A write ahead that fails costs nothing: the hand-in
writes those tables again. Real storage (file objects, SQLite), a real SQLite catalog and
file warehouse; the failure is the Parquet write raising once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog

import tabletopic.writer as writer_module
from broker.protocol.recordcodec import encode_batch
from tabletopic.commit import table_offsets
from tests.tablewriter import WriterSetup, table_writer

TOPIC = "ahead"
IDENT = ("default", TOPIC)
CONFIG: dict[str, str | None] = {
    "table.topic.enable": "true",
    "table.topic.convert.value.type": "json",
    "table.topic.commit.interval.ms": "60000",  # far longer than the test
}


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[WriterSetup]:
    async with table_writer(tmp_path, TOPIC) as s:
        s.writer.write_ahead_bytes = 1  # every table read is written ahead
        yield s


async def backlog_written(s: WriterSetup, per_partition: int) -> list[tuple[int, int]]:
    """Append a backlog to partitions 0 and 1, run the writer until the table holds it, and
    return the (partition, offset) of every row of the table."""
    await s.storage.create_topic(TOPIC, 2, CONFIG)
    for start in range(0, per_partition, 20):  # batches of 20 records
        for p in (0, 1):
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
        want = {0: per_partition, 1: per_partition}
        while await offsets() != want and time.monotonic() - began < 15:
            await asyncio.sleep(0.05)
        assert await offsets() == want, s.writer.status()
    finally:
        s.writer.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    rows = s.catalog.load_table(IDENT).scan().to_arrow().column("_kafka").to_pylist()
    return sorted((r["partition"], r["offset"]) for r in rows)


def data_files(catalog: Catalog) -> list[str]:
    return [t.file.file_path for t in catalog.load_table(IDENT).scan().plan_files()]


async def test_a_backlog_written_ahead_lands_once(setup: WriterSetup) -> None:
    rows = await backlog_written(setup, 100)
    assert rows == [(p, o) for p in (0, 1) for o in range(100)]  # each record exactly once
    assert setup.writer.writes_ahead >= 2  # both partitions wrote ahead of their hand-in
    assert setup.writer.status()["writes_ahead"] == setup.writer.writes_ahead
    assert setup.writer.commits == 1
    assert len(data_files(setup.catalog)) >= 2


async def test_a_failed_write_ahead_is_written_again_by_the_hand_in(
    setup: WriterSetup, monkeypatch: pytest.MonkeyPatch
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
    assert rows == [(p, o) for p in (0, 1) for o in range(100)]  # nothing lost, nothing twice
    assert len(calls) >= 3  # the failed write ahead, the other one, the rewrite
    # the failure was a write ahead's, absorbed by the hand-in: no step failed and was retried
    assert setup.writer.writes_ahead >= 2
    assert setup.writer.retries["error"] == 0, setup.writer.last_error
    assert setup.writer.commits == 1
