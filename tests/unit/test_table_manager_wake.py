"""The table topics' manager applies a topic change at once, not at its next poll: switching
`table.topic.enable` on (and off) over an existing topic starts (stops) its writer while the
poll interval is a minute away; a topic created with its table on starts one too.

broker.engine.TopicChanges: every engine bumps it on a topic change, and a wait returns at
once when the count is already past the one seen (a change made while the manager synced)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from broker.engine import TopicChanges
from broker.metadata.tablework import TableWork
from broker.nullstorage import NullStorage
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import open_object_store
from tabletopic.catalog import open_catalog
from tabletopic.manager import TableTopics

POLL_S = 60.0  # far longer than the test: only a wake-up can start a writer in time
WAIT_S = 10.0


async def _until(cond: object, what: str) -> None:
    assert callable(cond)
    end = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < end, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.02)


async def test_switching_a_table_on_and_off_applies_at_once(tmp_path: Path) -> None:
    storage = Storage(open_object_store((tmp_path / "objects").as_uri()),
                      SqliteMetadataStore(tmp_path / "meta.db"), WalSettings(flush_interval_ms=1))
    await storage.open()
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    tables = TableTopics(storage, catalog, poll_s=POLL_S)
    tables.work = TableWork(storage.meta)
    await tables.work.open()
    run = asyncio.create_task(tables.run())
    try:
        await storage.create_topic("plain", 1, {})
        await asyncio.sleep(0.2)  # the manager is waiting for its next poll now
        assert not tables.writers
        await storage.set_topic_configs("plain", {"table.topic.enable": "true"}, False)
        await _until(lambda: "plain" in tables.writers, "the writer of a table switched on")
        await storage.set_topic_configs("plain", {}, False)
        await _until(lambda: "plain" not in tables.writers, "the writer stopped")
        await storage.create_topic("born", 1, {"table.topic.enable": "true"})
        await _until(lambda: "born" in tables.writers, "the writer of a new table topic")
        count = storage.changes.count
        for _ in range(3):  # heartbeats that find nothing new bump nothing
            await storage._sync()
        assert storage.changes.count == count
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await storage.close()


async def test_a_change_made_during_a_sync_is_not_missed() -> None:
    changes = TopicChanges()
    seen = changes.count
    changes.bump()  # after the count was read, before the wait
    began = time.monotonic()
    await changes.wait_past(seen, POLL_S)
    assert time.monotonic() - began < WAIT_S
    waiter = asyncio.create_task(changes.wait_past(changes.count, POLL_S))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    changes.bump()
    await asyncio.wait_for(waiter, WAIT_S)
    await changes.wait_past(changes.count, 0.01)  # nothing new: the timeout ends it


async def test_the_null_engine_counts_its_changes_too() -> None:
    null = NullStorage()
    before = null.changes.count
    await null.create_topic("t", 1, {})
    await null.set_topic_configs("t", {"retention.ms": "1000"}, False)
    await null.set_topic_configs("t", {"retention.ms": "2000"}, True)  # validate only
    await null.delete_topic("t")
    assert null.changes.count == before + 3
