"""Runs a TableWriter for every topic with `table.topic.enable=true` (started and stopped as
topics are created, altered and deleted)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from pyiceberg.catalog import Catalog

from broker.engine import StorageEngine
from tabletopic.config import TableTopicConfig
from tabletopic.orphans import ORPHAN_MIN_AGE_S
from tabletopic.schemaconvert import SchemaById
from tabletopic.writer import TableWriter

log = logging.getLogger(__name__)


class TableTopics:
    def __init__(
        self,
        storage: StorageEngine,
        catalog: Catalog,
        poll_s: float = 0.5,
        orphan_min_age_s: float = ORPHAN_MIN_AGE_S,
    ) -> None:
        self.storage = storage
        self.orphan_min_age_s = orphan_min_age_s
        self.catalog = catalog
        self.poll_s = poll_s
        self.schemas: SchemaById | None = None  # the Schema Registry, set by broker.app
        self.writers: dict[str, tuple[TableWriter, asyncio.Task[None]]] = {}

    async def run(self) -> None:
        try:
            while True:
                await self._sync()
                await asyncio.sleep(self.poll_s)
        finally:
            for name in list(self.writers):
                await self._stop(name)

    async def _sync(self) -> None:
        wanted = set()
        for name, topic in self.storage.topics.items():
            try:
                if TableTopicConfig.of(name, topic.config).enabled:
                    wanted.add(name)
            except Exception:
                log.exception("table topic config of %s", name)
        for name in wanted - set(self.writers):
            writer = TableWriter(
                name, self.storage, self.catalog, self.orphan_min_age_s, self.schemas
            )
            task = asyncio.create_task(writer.run(), name=f"table-topic {name}")
            self.writers[name] = (writer, task)
        for name in set(self.writers) - wanted:
            await self._stop(name)
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

    def status(self) -> list[dict[str, Any]]:
        return [w.status() for w, _t in self.writers.values()]
