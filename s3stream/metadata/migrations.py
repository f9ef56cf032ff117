"""Numbered schema migrations, one version per component, recorded in `schema_version`.

A component (the store's own tables, "s3stream.metadata"; the broker's Kafka tables,
"broker.metadata"; the Schema Registry's) owns a list of migrations: migration N (1-based)
takes its tables from version N-1 to N. `run_migrations` brings one component up to date:
- it creates `schema_version(component, version, applied_at)` if missing; one row per applied
  version (applied_at in ms since the epoch, 0 for a version found already in place), the
  component's version being the highest;
- a component with no row whose tables were made before versions were recorded (its
  `legacy_version` says which version they are) gets that version recorded, nothing else is
  touched: a database made by the code that had no `schema_version` opens as it was;
- each pending migration runs in its own write transaction together with its version row, so
  a failure leaves the database at the last version that applied completely;
- a component whose recorded version is newer than the code knows raises SchemaTooNewError and
  the transaction is rolled back: nothing is written to such a database;
- every transaction first takes the dialect's schema lock (PostgreSQL: an advisory transaction
  lock; SQLite: BEGIN IMMEDIATE already holds the database's write lock) and reads the version
  under it, so brokers opening one database together apply each migration exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from s3stream.metadata.backend import SCHEMA, Connection, Dialect
from s3stream.metadata.model import MetadataError

# One migration: runs its statements on db (inside the runner's transaction).
Migration = Callable[[Connection, Dialect], None]

VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version(component TEXT NOT NULL, version {int} NOT NULL,"
    " applied_at {int} NOT NULL, PRIMARY KEY(component, version))"
)


class SchemaTooNewError(MetadataError):
    """The database holds a component version newer than this code: it was written by a newer
    floe. It is refused (not opened, not written) rather than misread."""


@dataclass(frozen=True)
class Component:
    """A set of tables with its own version. `migrations[i]` is migration i+1.
    `legacy_version(db, dialect)` answers, for a database with no `schema_version` row for this
    component, which version its tables already are (0: none, apply everything)."""

    name: str
    migrations: Sequence[Migration]
    legacy_version: Callable[[Connection, Dialect], int] | None = None

    @property
    def latest(self) -> int:
        return len(self.migrations)


def sql_migration(script: str) -> Migration:
    """A migration from `;`-separated SQL; `{int}`, `{identity}` and `{without_rowid}` are
    replaced by the dialect's column types (see backend.Dialect)."""
    def apply(db: Connection, dialect: Dialect) -> None:
        text = script.format(int=dialect.int_type, identity=dialect.identity,
                             without_rowid=dialect.without_rowid)
        for statement in text.split(";"):
            if statement.strip():
                db.execute(statement)
    return apply


def table_exists(db: Connection, dialect: Dialect, table: str) -> bool:
    """Whether `table` exists (in SQLite's main database / PostgreSQL's search path)."""
    return db.execute(dialect.table_exists, (table,)).fetchone()[0] is not None


def current_version(db: Connection, component: str) -> int | None:
    """The recorded version of component (None: no row; the version table must exist)."""
    row = db.execute("SELECT max(version) FROM schema_version WHERE component=?",
                     (component,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _record(db: Connection, component: str, version: int, applied_at: int) -> None:
    db.execute("INSERT INTO schema_version(component, version, applied_at) VALUES (?,?,?)",
               (component, version, applied_at))


def run_migrations(
    txn: Callable[[], AbstractContextManager[Connection]], dialect: Dialect,
    component: Component,
) -> int:
    """Bring `component` up to its latest version (see the module docstring); returns it.
    `txn()` opens one write transaction (the store's `_txn`); runs on the store's thread.
    Raises SchemaTooNewError for a database newer than the code."""
    while True:
        with txn() as db:
            if dialect.schema_lock:
                db.execute(dialect.schema_lock)
            if table_exists(db, dialect, "schema_version"):
                version = current_version(db, component.name)
            else:
                version = None
            if version is not None and version > component.latest:
                raise SchemaTooNewError(
                    f"metadata component {component.name!r} is at schema version {version},"
                    f" this floe knows versions up to {component.latest}: the database was"
                    " written by a newer floe; refusing to open it (nothing was changed)")
            db.execute(VERSION_TABLE.format(int=dialect.int_type))
            if version is None:
                legacy = component.legacy_version(db, dialect) if component.legacy_version else 0
                if legacy > component.latest:
                    raise SchemaTooNewError(
                        f"metadata component {component.name!r} is at version {legacy} (before"
                        f" versions were recorded), this floe knows up to {component.latest}")
                if legacy:
                    for v in range(1, legacy + 1):
                        _record(db, component.name, v, 0)
                    continue  # recorded as found; pending migrations in their own transactions
                version = 0
            if version == component.latest:
                return version
            component.migrations[version](db, dialect)
            _record(db, component.name, version + 1, int(time.time() * 1000))


LEGACY_HANDOVER = """
CREATE TABLE legacy_stream_partitions AS
    SELECT stream_id, topic, partition FROM streams WHERE deleted = 0;
DROP INDEX IF EXISTS streams_live;
ALTER TABLE streams DROP COLUMN topic;
ALTER TABLE streams DROP COLUMN partition
"""


def _store_legacy_version(db: Connection, dialect: Dialect) -> int:
    """A store made before `schema_version` existed has exactly migration 1's tables."""
    return 1 if table_exists(db, dialect, "topics") else 0


STORE = Component(
    "s3stream.metadata",
    [
        # 1: the schema as it was when versions started being recorded (commit 59112ef on).
        sql_migration(SCHEMA + ";INSERT INTO meta(key, value) VALUES ('next_object_id', '1')"
                      " ON CONFLICT DO NOTHING"),
        # 2: chunks by object: the object GC (objects no chunk references: NOT EXISTS ...
        # WHERE c.object_id = o.object_id) and compaction's chunks_of_objects scanned the
        # whole chunk index once per object without it.
        sql_migration("CREATE INDEX IF NOT EXISTS chunks_object ON chunks(object_id)"),
        # 3: s3stream knows streams, not Kafka partitions. A live stream's topic and partition
        # are handed over in `legacy_stream_partitions(stream_id, topic, partition)` and the
        # columns dropped. The other Kafka tables migration 1 made (`topics`,
        # `producer_batches`, `group_offsets`, meta['next_producer_id']) are no longer this
        # component's: left as they are for their owner (broker.metadata's migration 1 moves
        # and drops them, and the hand-over table).
        sql_migration(LEGACY_HANDOVER),
    ],
    _store_legacy_version,
)
