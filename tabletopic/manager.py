"""Runs a TableWriter for every topic with `table.topic.enable=true` (started and stopped as
topics are created, altered and deleted).

The writer's modules (pyarrow, Parquet, the converters: ~60 MiB of a broker's memory) are
imported with the first table topic (tabletopic.lazyload): a broker without table topics
never loads them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import Catalog

from broker.engine import StorageEngine
from broker.metadata.tablestate import TableStates
from broker.metadata.tablework import TableWork
from tabletopic import lazyload
from tabletopic.config import ORPHAN_MIN_AGE_S, TableTopicConfig
from tabletopic.freshness import freshness

if TYPE_CHECKING:
    from tabletopic.schemaconvert import SchemaById
    from tabletopic.writer import TableWriter

log = logging.getLogger(__name__)
REQUEST_POLL_S = 0.1  # how soon a worker sees a commit request made on another broker


class TableTopics:
    def __init__(
        self,
        storage: StorageEngine,
        catalog: Catalog,
        poll_s: float = 0.5,
        orphan_min_age_s: float = ORPHAN_MIN_AGE_S,
        node_id: int = 0,
    ) -> None:
        self.storage = storage
        self.node_id = node_id
        self.orphan_min_age_s = orphan_min_age_s
        self.catalog = catalog
        self.poll_s = poll_s
        self.schemas: SchemaById | None = None  # the Schema Registry, set by broker.app
        self.writers: dict[str, tuple[TableWriter, asyncio.Task[None]]] = {}
        # operators' pauses (tabletopic.ops), read from the metadata store on every poll
        self.states: TableStates | None = None
        self.paused: dict[str, str] = {}  # topic -> why it is paused
        # operations (rollback, rebuild) holding a writer here: not overridden by a poll
        self.holds: dict[str, str] = {}
        self.configs: dict[str, TableTopicConfig] = {}  # each writer's, to see changes
        # workers, commit requests and progress across brokers (set by broker.app)
        self.work: TableWork | None = None

    async def run(self) -> None:
        requests = asyncio.create_task(self._follow_requests(), name="table-requests")
        try:
            while True:
                seen = self.storage.changes.count
                await self._sync()
                # the next poll, or at once when a topic is created, deleted or reconfigured
                await self.storage.changes.wait_past(seen, self.poll_s)
        finally:
            requests.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await requests
            for name in list(self.writers):
                await self._stop(name)

    async def _follow_requests(self) -> None:
        """Tell the writers of the commit requests of their topics' coordinators (on any
        broker), every REQUEST_POLL_S."""
        while True:
            await asyncio.sleep(REQUEST_POLL_S)
            if self.work is None or not self.writers:
                continue
            try:
                ids = await self.work.requests()
            except Exception as e:
                log.warning("table topics: commit requests could not be read: %r", e)
                continue
            for name, (w, _t) in list(self.writers.items()):
                if name in ids:
                    w.request_seen(ids[name])

    async def _sync(self) -> None:
        if self.states is not None:
            try:
                states = await self.states.all()
                self.paused = {t: s.reason for t, s in states.items() if s.paused}
            except Exception:
                log.exception("table topic states (pause) could not be read; keeping the last")
        for name, (w, _t) in self.writers.items():
            w.paused = self.pause_of(name)
        wanted = set()
        for name, topic in self.storage.topics.items():
            try:
                cfg = TableTopicConfig.of(name, topic.config)
            except Exception:
                log.exception("table topic config of %s", name)
                continue
            if cfg.enabled:
                wanted.add(name)
                if name in self.writers and self.configs.get(name) != cfg:
                    # a changed setting (converter, ...) applies from the table's offsets on
                    log.info("table topic %s: settings changed; restarting its writer", name)
                    await self._stop(name)
                self.configs[name] = cfg
        if wanted - set(self.writers):
            # the first table topic loads the writer's modules (pyarrow, ...), off the loop
            await lazyload.load("tabletopic.writer")
            from tabletopic.writer import TableWriter

            for name in wanted - set(self.writers):  # again: the import awaited
                assert self.work is not None, "TableTopics.work is set before run()"
                writer = TableWriter(
                    name, self.storage, self.catalog, self.work, self.node_id,
                    self.orphan_min_age_s, self.schemas
                )
                writer.paused = self.pause_of(name)
                task = asyncio.create_task(writer.run(), name=f"table-topic {name}")
                self.writers[name] = (writer, task)
        for name in set(self.writers) - wanted:
            await self._stop(name)
            if name not in self.storage.topics and self.work is not None:
                try:  # the topic is gone: so are its commit requests, file sets, progress
                    await self.work.forget(name)
                except Exception as e:
                    log.warning("table topic %s: its rows could not be removed: %r", name, e)
        for name, (_w, task) in list(self.writers.items()):
            if task.done() and name in wanted and not task.cancelled():
                exc = task.exception()
                if exc is not None:
                    log.error("table topic %s writer failed: %r; restarting", name, exc)
                del self.writers[name]

    async def _stop(self, name: str) -> None:
        entry = self.writers.pop(name, None)
        if entry is None:
            return
        writer, task = entry
        writer.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    def pause_of(self, topic: str) -> str | None:
        return self.holds.get(topic) or self.paused.get(topic)

    def apply_state(self, topic: str, paused: str | None) -> None:
        """Pause (why) or resume (None) a topic's writer now, without waiting for the poll."""
        if paused is None:
            self.paused.pop(topic, None)
        else:
            self.paused[topic] = paused
        if topic in self.writers:
            self.writers[topic][0].paused = self.pause_of(topic)

    def hold(self, topic: str, why: str | None) -> None:
        """An operation holds (why) or releases (None) the topic's writer on this broker."""
        if why is None:
            self.holds.pop(topic, None)
        else:
            self.holds[topic] = why
        if topic in self.writers:
            self.writers[topic][0].paused = self.pause_of(topic)

    async def wait_idle(self, topic: str, timeout_s: float) -> None:
        """Until the topic's writer is paused and holds nothing (its commit in flight done);
        TimeoutError after timeout_s. A topic without a running writer is idle."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while topic in self.writers and not self.writers[topic][0].idle:
            if asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError(f"the writer of {topic} did not stop within {timeout_s:g} s")
            await asyncio.sleep(0.05)

    def status(self) -> list[dict[str, Any]]:
        if not self.writers:
            return []
        from tabletopic.fileio import TABLE_IO  # loaded with the writers

        return [{**(st := w.status()), "freshness": freshness(w),
                 "costs": TABLE_IO.report(st["table"])} for w, _t in self.writers.values()]
