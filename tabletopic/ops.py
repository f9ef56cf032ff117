"""Operating a table topic (issue 18), run by the broker behind its admin port
(`floe table pause|resume|rollback|rebuild|lineage|locate`, broker/table_cli.py):

  - pause / resume: the state lives in the metadata store (broker.metadata.tablestate), so any
    broker's writer honours it within `TableTopics.poll_s`; a paused writer drops what it had
    read and, once resumed, starts again from the table's `floe.offsets`.
  - rollback to snapshot S: one guarded catalog commit makes S current on `main` and sets
    `floe.offsets` to S's (the table is exactly as it was at S, offsets included), with the
    writer held; resumed, it re-materialises the records after S exactly once. Refused when the
    log no longer starts at or before S's offsets (retention or DeleteRecords removed them).
  - rebuild from P:O (or every row, from the log start): with the writer held, one guarded
    commit deletes the rows at and after those offsets and adds them again, read from the log
    and converted with today's settings (tabletopic.rebuild); `floe.offsets` is unchanged.
    Upsert tables (--all only): the commit deletes every row and rewinds `floe.offsets` to the
    log start, and the writer writes the log again, merging by key. Refused below the log
    start, like rollback.

Both guarded commits assert the table UUID and the current snapshot of `main` (as floe's own
commits do, tabletopic.commit), so a commit racing them (Spark, another operation) makes one
fail cleanly instead of leaving offsets and rows apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)

from broker.engine import StorageEngine
from broker.metadata.tablestate import TableStates
from tabletopic import lazyload
from tabletopic.config import TableTopicConfig
from tabletopic.contract import (
    MAIN,
    OFFSETS,
    encode_offsets,
    offsets_of,
    snapshot_summary,
    table_offsets,
)
from tabletopic.lineage import OPERATION, lineage, locate
from tabletopic.manager import TableTopics

HOLD_TIMEOUT_S = 30.0  # how long an operation waits for the writer to stop (a commit in flight)



async def _load_rebuild() -> None:
    """tabletopic.rebuild loads pyarrow, which a broker without table topics never needs."""
    await lazyload.load("tabletopic.rebuild")


class OperationError(Exception):
    """An operation refused (bad arguments, the log no longer holds the offsets, ...)."""


class TableOps:
    def __init__(
        self, storage: StorageEngine, catalog: Catalog, tables: TableTopics, states: TableStates
    ) -> None:
        self.storage = storage
        self.catalog = catalog
        self.tables = tables
        self.states = states

    # -- shared ----------------------------------------------------------------------------
    def config(self, topic: str) -> TableTopicConfig:
        if topic not in self.storage.topics:
            raise OperationError(f"no topic {topic!r}")
        cfg = TableTopicConfig.of(topic, self.storage.topic(topic).config)
        if not cfg.enabled:
            raise OperationError(f"topic {topic!r} is not a table topic")
        return cfg

    async def load(self, topic: str) -> Table:
        return await asyncio.to_thread(self.catalog.load_table, self.config(topic).identifier)

    def check_retained(self, topic: str, needed: dict[int, int]) -> None:
        """Refuse when the log no longer holds an offset the operation must re-read."""
        for p, o in sorted(needed.items()):
            start, end = self.storage.offsets(topic, p)
            if o < start:
                raise OperationError(
                    f"partition {p}: offset {o} is needed but the log starts at {start} "
                    "(retention or DeleteRecords removed it); the table cannot be rebuilt "
                    "from the log there"
                )
            if o > end:
                raise OperationError(f"partition {p}: offset {o} is past the log end {end}")

    # -- pause / resume --------------------------------------------------------------------
    async def pause(self, topic: str, reason: str = "paused by an operator") -> dict[str, Any]:
        self.config(topic)
        await self.states.set(topic, True, reason)
        self.tables.apply_state(topic, reason)
        return {"topic": topic, "paused": True, "reason": reason}

    async def resume(self, topic: str) -> dict[str, Any]:
        self.config(topic)
        await self.states.set(topic, False, "")
        self.tables.apply_state(topic, None)
        return {"topic": topic, "paused": False}

    @contextlib.asynccontextmanager
    async def held(self, topic: str, why: str) -> AsyncIterator[None]:
        """Hold the writer (state in the store, and the local writer stopped) while an
        operation rewrites the table; then back to the state it was in (an operator's pause
        stays)."""
        if topic in self.tables.holds:
            raise OperationError(f"{topic}: {self.tables.holds[topic]}; try again after it")
        self.tables.hold(topic, f"{why} in progress")
        try:
            before = (await self.states.all()).get(topic)
            was_paused = before is not None and before.paused
            if not was_paused:
                await self.states.set(topic, True, f"{why} in progress")
            try:
                await self.tables.wait_idle(topic, HOLD_TIMEOUT_S)
                yield
            finally:
                if not was_paused and await self.states.clear_if(topic, f"{why} in progress"):
                    self.tables.apply_state(topic, None)
        finally:
            self.tables.hold(topic, None)

    # -- lineage ---------------------------------------------------------------------------
    async def lineage(self, topic: str) -> dict[str, Any]:
        table = await self.load(topic)
        return {"topic": topic, **lineage(table)}

    async def locate(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        doc = await self.lineage(topic)
        return {"topic": topic, "partition": partition, "offset": offset,
                "snapshot": locate(doc, partition, offset)}

    # -- rollback --------------------------------------------------------------------------
    async def rollback(self, topic: str, snapshot_id: int) -> dict[str, Any]:
        table = await self.load(topic)
        snap = table.metadata.snapshot_by_id(snapshot_id)
        if snap is None:
            raise OperationError(f"table {topic}: no snapshot {snapshot_id}")
        summary = dict(snap.summary.additional_properties) if snap.summary else {}
        if OFFSETS not in summary:
            raise OperationError(f"snapshot {snapshot_id} has no {OFFSETS}: not a floe snapshot")
        target = offsets_of(summary)
        # a partition S does not know (added after it) is written again from offset 0
        self.check_retained(topic, {**{p: 0 for p in table_offsets(table)}, **target})
        async with self.held(topic, "rollback"):
            table = await self.load(topic)  # as it is now that the writer is still
            updates: tuple[TableUpdate, ...] = (
                SetSnapshotRefUpdate.model_validate(
                    {"ref-name": MAIN, "type": "branch", "snapshot-id": snapshot_id}
                ),
                SetPropertiesUpdate(updates={OFFSETS: encode_offsets(target)}),
            )
            before = table_offsets(table)
            await _load_rebuild()
            from tabletopic.rebuild import guards

            await asyncio.to_thread(self.catalog.commit_table, table, tuple(guards(table)),
                                    updates)
        return {"topic": topic, "snapshot": snapshot_id, "offsets_before": before,
                "offsets": target, "at": time.time()}

    # -- rebuild ---------------------------------------------------------------------------
    async def rebuild(self, topic: str, frm: dict[int, int] | None) -> dict[str, Any]:
        """Rewrite the rows from the given offsets on (None: every row, from each partition's
        log start) from the log in one commit (tabletopic.rebuild). Upsert tables (--all only):
        every row deleted and the offsets rewound to the log start in one commit; the writer
        then writes the log again, merging by key."""
        cfg = self.config(topic)
        if cfg.upsert and frm is not None:
            raise OperationError(
                f"{topic} is an upsert table: its rows before an offset may have been replaced "
                "by the rows a partial rebuild removes; use --all (or rollback)"
            )
        parts = range(len(self.storage.topic(topic).streams))
        if frm is None:
            target = {p: self.storage.offsets(topic, p)[0] for p in parts}
        else:
            bad = sorted(set(frm) - set(parts))
            if bad:
                raise OperationError(f"topic {topic} has no partition {bad[0]}")
            target = dict(frm)
        self.check_retained(topic, target)
        async with self.held(topic, "rebuild"):
            table = await self.load(topic)
            current = table_offsets(table)
            for p, o in target.items():
                if o > current.get(p, o):
                    raise OperationError(
                        f"partition {p}: the table holds offsets below {current[p]} only; "
                        f"nothing to rebuild from {o}"
                    )
            if not cfg.upsert:
                await _load_rebuild()
                from tabletopic.rebuild import rebuild

                return await rebuild(self.storage, self.catalog, self.tables.schemas, topic,
                                     cfg, target, everything=frm is None)
            offsets = {**current, **target}
            await asyncio.to_thread(self._rewind_sync, topic, table, offsets)
        return {"topic": topic, "offsets_before": current, "offsets": offsets}

    def _rewind_sync(self, topic: str, table: Table, offsets: dict[int, int]) -> None:
        from tabletopic.rebuild import condition, guards  # in a thread: it may load pyarrow

        encoded = encode_offsets(offsets)
        summary = {**snapshot_summary(topic, encoded), OPERATION: "rebuild"}
        tx = table.transaction()
        tx.delete(condition(None), snapshot_properties=summary)
        if not any(isinstance(u, AddSnapshotUpdate) for u in tx._updates):
            with tx.update_snapshot(snapshot_properties=summary).fast_append():
                pass  # no row to delete: the snapshot still carries the rewound offsets
        tx.set_properties({OFFSETS: encoded})
        requirements = [
            *guards(table),
            AssertCurrentSchemaId.model_validate(
                {"current-schema-id": table.metadata.current_schema_id}
            ),
        ]
        self.catalog.commit_table(table, tuple(requirements), tx._updates)
