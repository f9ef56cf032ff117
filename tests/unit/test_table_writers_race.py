"""Two real TableWriters of one table topic running at once on one Storage (what happens when a
writer is restarted while the old one's commit is still in its thread, or two brokers point at
the same table): they race commit against commit, data and all-dead-letter ones.

What must survive: the table holds every convertible record of the topic exactly once, its
`floe.offsets` reaches the end of every partition, and every record that did not convert is in
the dead-letter topic (at least once: dead letters are written before the commit)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.metadata.tablework import TableWork
from broker.protocol import records
from broker.protocol.recordcodec import Record, decode_records, encode_batch
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import open_object_store
from tabletopic.catalog import open_catalog
from tabletopic.contract import table_offsets
from tabletopic.writer import TableWriter

TOPIC = "ev"
PARTITIONS = 2
BATCHES = 40  # per partition; batch k holds 5 records, all of them invalid when k % 4 == 1
CONFIG: dict[str, str | None] = {
    "table.topic.enable": "true",
    "table.topic.convert.value.type": "json",
    "table.topic.commit.interval.ms": "40",
}


def batch(k: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    bad = k % 4 == 1
    return [
        (f"k{k}-{i}".encode(), b"{not json" if bad else f'{{"k": {k}, "i": {i}}}'.encode(), [])
        for i in range(5)
    ]


async def read_all(storage: Storage, topic: str, partition: int) -> list[Record]:
    out: list[Record] = []
    offset, (_start, end) = 0, storage.offsets(topic, partition)
    while offset < end:
        data = await storage.read(topic, partition, offset, 1 << 20, True)
        for h in records.iter_headers(data):
            out += [r for r in decode_records(data, h) if r.offset >= offset]
            offset = max(offset, h.next_offset)
    return out


async def test_two_writers_of_one_table_topic(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = Storage(
        open_object_store((tmp_path / "objects").as_uri()),
        SqliteMetadataStore(tmp_path / "meta.db"),
        WalSettings(flush_interval_ms=1),
    )
    await storage.open()
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    work = TableWork(storage.meta)
    await work.open()
    writers = [TableWriter(TOPIC, storage, catalog, work, orphan_min_age_s=3600)
               for _ in range(2)]
    tasks: list[asyncio.Task[None]] = []
    try:
        await storage.create_topic(TOPIC, PARTITIONS, CONFIG)
        # the namespace exists before the writers start: two first-time creations collide in
        # the catalog (a retried IntegrityError) and the backoff can keep the writers apart
        catalog.create_namespace_if_not_exists("default")
        caplog.set_level(logging.INFO, logger="tabletopic.writer")
        tasks = [asyncio.create_task(w.run()) for w in writers]
        invalid: set[tuple[int, int]] = set()
        for k in range(BATCHES):
            for p in range(PARTITIONS):
                res = await storage.append(TOPIC, p, encode_batch(batch(k), 1_700_000_000_000))
                if k % 4 == 1:
                    invalid |= {(p, res.base_offset + i) for i in range(5)}
            await asyncio.sleep(0.08)  # longer than the commit interval: commits of one batch
        ident = ("default", TOPIC)

        async def caught_up() -> dict[int, int]:
            ends = {p: storage.offsets(TOPIC, p)[1] for p in range(PARTITIONS)}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    if table_offsets(await asyncio.to_thread(catalog.load_table, ident)) == ends:
                        break
                await asyncio.sleep(0.1)
            return ends

        await caught_up()
        # then one batch of invalid records alone: whichever writer commits it, its commit
        # holds dead letters only (the table holds everything before it already)
        for p in range(PARTITIONS):
            res = await storage.append(TOPIC, p, encode_batch(batch(1), 1_700_000_000_000))
            invalid |= {(p, res.base_offset + i) for i in range(5)}
        ends = await caught_up()
        for w in writers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

        table = catalog.load_table(ident)
        assert table_offsets(table) == ends
        keys = Counter(
            (r["partition"], r["offset"])
            for r in table.scan().to_arrow().column("_kafka").to_pylist()
        )
        everything = {(p, o) for p in range(PARTITIONS) for o in range(ends[p])}
        assert max(keys.values()) == 1, "a record is in the table twice"
        assert set(keys) == everything - invalid
        dead = {
            (
                int(dict(r.headers)["floe.source.partition"] or b""),
                int(dict(r.headers)["floe.source.offset"] or b""),
            )
            for r in await read_all(storage, f"{TOPIC}.dlq", 0)
        }
        assert dead == invalid
        empty = [
            s
            for s in table.snapshots()
            if s.summary and s.summary["floe.offsets"] and int(s.summary["added-records"] or 0) == 0
        ]
        assert empty, "no all-dead-letter commit happened"
        # both coordinators commit, each its own writer's file sets: commits lost to the
        # other's, file sets dropped (their writer starts again from the table's offsets)
        raced = sum(w.coordinator.conflicts for w in writers) > 0 or (
            "was not committed" in caplog.text
        )
        assert raced, "the writers never raced (no stale offsets, no commit conflict)"
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await storage.close()
