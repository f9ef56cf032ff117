"""Operator state of table topics, kept in the metadata store so that every broker of a cluster
sees it: component "broker.table_states" of the shared migration runner, one table

  `table_topic_states(topic, paused, reason, updated_ms)`: a row per topic an operator paused
  (`floe table pause`) or an operation (rollback, rebuild) paused while it works; `paused` 0
  after `floe table resume`. A topic without a row runs.

Writers read it every `TableTopics.poll_s` (tabletopic.manager): a pause takes effect within
that time plus the commit in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from s3stream.metadata import MetadataStore
from s3stream.metadata.backend import Connection
from s3stream.metadata.migrations import Component, sql_migration

COMPONENT = Component("broker.table_states", [sql_migration(
    """CREATE TABLE table_topic_states(
        topic TEXT PRIMARY KEY, paused {int} NOT NULL, reason TEXT NOT NULL,
        updated_ms {int} NOT NULL)"""
)])


@dataclass(frozen=True)
class TableState:
    paused: bool
    reason: str
    updated_ms: int


class TableStates:
    """Read and write the pause state of table topics in the metadata store."""

    def __init__(self, meta: MetadataStore) -> None:
        self.meta = meta

    async def open(self) -> None:
        await self.meta.migrate(COMPONENT)

    async def all(self) -> dict[str, TableState]:
        def read() -> dict[str, TableState]:
            with self.meta._txn(read_only=True) as db:
                rows = db.execute(
                    "SELECT topic, paused, reason, updated_ms FROM table_topic_states"
                ).fetchall()
            return {r[0]: TableState(bool(r[1]), r[2], int(r[3])) for r in rows}

        return await self.meta._run(read)

    async def set(self, topic: str, paused: bool, reason: str) -> None:
        def write() -> None:
            with self.meta._txn() as db:
                _upsert(db, topic, paused, reason)

        await self.meta._run(write)

    async def clear_if(self, topic: str, reason: str) -> bool:
        """Resume `topic` only if it is still paused for `reason` (an operator's pause made
        meanwhile stays); True if it was."""
        def write() -> bool:
            with self.meta._txn() as db:
                cur = db.execute(
                    "UPDATE table_topic_states SET paused=0, reason='', updated_ms=?"
                    " WHERE topic=? AND paused=1 AND reason=?",
                    (int(time.time() * 1000), topic, reason),
                )
                return bool(cur.rowcount)

        return await self.meta._run(write)

    async def delete(self, topic: str) -> None:
        def write() -> None:
            with self.meta._txn() as db:
                db.execute("DELETE FROM table_topic_states WHERE topic=?", (topic,))

        await self.meta._run(write)


def _upsert(db: Connection, topic: str, paused: bool, reason: str) -> None:
    db.execute(
        "INSERT INTO table_topic_states(topic, paused, reason, updated_ms) VALUES (?,?,?,?)"
        " ON CONFLICT(topic) DO UPDATE SET paused=excluded.paused, reason=excluded.reason,"
        " updated_ms=excluded.updated_ms",
        (topic, int(paused), reason, int(time.time() * 1000)),
    )
