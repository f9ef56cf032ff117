"""Durable registry state in the broker's metadata store (SQLite or PostgreSQL).

Tables (created by the numbered migrations in `MIGRATIONS`, run by the store's shared runner,
s3stream.metadata.migrations, as component "schema_registry" in `schema_version`; a database
from before that runner has its version in `meta['schema_registry.migration']`, which is
recorded as found; the store's own tables are not touched):
- `sr_schemas(id, schema_type, schema, refs, fingerprint)`: every distinct schema once, with
  its global id; `fingerprint` (type, canonical text and references) is unique, so the same
  schema registered under two subjects gets one id.
- `sr_versions(subject, version, schema_id, deleted)`: a subject's versions; `deleted` = 1 is a
  soft delete, a hard delete removes the row.
- `sr_config(subject, compatibility)`: the level per subject; subject '' is the global one.

Every write runs in one transaction of the store's thread (`MetadataStore._run/_txn`) that
first locks the row `meta['schema_registry.lock']` (SQLite: the database lock taken by BEGIN
IMMEDIATE), so registrations on several brokers sharing PostgreSQL apply one at a time and
ids and version numbers are never handed out twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from s3stream.metadata import MetadataStore
from s3stream.metadata.backend import Connection, Dialect
from s3stream.metadata.migrations import Component, Migration, sql_migration

T = TypeVar("T")

MIGRATIONS: list[Migration] = [sql_migration(script) for script in [
    # 1
    """CREATE TABLE IF NOT EXISTS sr_schemas(
        id {int} PRIMARY KEY, schema_type TEXT NOT NULL, schema TEXT NOT NULL,
        refs TEXT NOT NULL, fingerprint TEXT NOT NULL UNIQUE);
    CREATE TABLE IF NOT EXISTS sr_versions(
        subject TEXT NOT NULL, version {int} NOT NULL, schema_id {int} NOT NULL,
        deleted {int} NOT NULL DEFAULT 0, PRIMARY KEY(subject, version));
    CREATE TABLE IF NOT EXISTS sr_config(subject TEXT PRIMARY KEY, compatibility TEXT NOT NULL);
    INSERT INTO meta(key, value) VALUES ('schema_registry.next_id', '1') ON CONFLICT DO NOTHING;
    INSERT INTO meta(key, value) VALUES ('schema_registry.lock', '') ON CONFLICT DO NOTHING""",
]]


def _legacy_version(db: Connection, dialect: Dialect) -> int:
    """The version a registry migrated before the shared runner recorded in `meta`."""
    row = db.execute("SELECT value FROM meta WHERE key='schema_registry.migration'").fetchone()
    return int(row[0]) if row else 0


COMPONENT = Component("schema_registry", MIGRATIONS, _legacy_version)


@dataclass(frozen=True)
class Reference:
    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class StoredSchema:
    id: int
    schema_type: str
    schema: str
    references: tuple[Reference, ...]


@dataclass(frozen=True)
class VersionRow:
    subject: str
    version: int
    schema_id: int
    deleted: bool


def _refs(text: str) -> tuple[Reference, ...]:
    return tuple(Reference(r["name"], r["subject"], int(r["version"])) for r in json.loads(text))


class RegistryStore:
    """Blocking SQL helpers, always called inside `run(fn)` on the metadata store's thread."""

    def __init__(self, meta: MetadataStore) -> None:
        self.meta = meta

    async def run(self, fn: Callable[[Connection], T], write: bool = False) -> T:
        """fn(db) in one transaction (a write one holding the registry lock if `write`)."""
        def txn() -> T:
            with self.meta._txn(read_only=not write) as db:
                if write:
                    db.execute("SELECT value FROM meta WHERE key='schema_registry.lock'"
                               f"{self.meta.for_update}").fetchone()
                return fn(db)
        return await self.meta._run(txn)

    async def migrate(self) -> int:
        """Apply the registry's pending migrations (each once, also with brokers opening one
        PostgreSQL database together); returns the registry's schema version. Raises
        SchemaTooNewError for tables written by a newer floe."""
        return await self.meta.migrate(COMPONENT)

    # -- reads (inside run) ------------------------------------------------------------------
    @staticmethod
    def schema_by_id(db: Connection, schema_id: int) -> StoredSchema | None:
        row = db.execute("SELECT id, schema_type, schema, refs FROM sr_schemas WHERE id=?",
                         (schema_id,)).fetchone()
        return None if row is None else StoredSchema(int(row[0]), row[1], row[2], _refs(row[3]))

    @staticmethod
    def schema_by_fingerprint(db: Connection, fingerprint: str) -> StoredSchema | None:
        row = db.execute("SELECT id, schema_type, schema, refs FROM sr_schemas"
                         " WHERE fingerprint=?", (fingerprint,)).fetchone()
        return None if row is None else StoredSchema(int(row[0]), row[1], row[2], _refs(row[3]))

    @staticmethod
    def versions(db: Connection, subject: str) -> list[VersionRow]:
        return [VersionRow(subject, int(v), int(i), bool(d)) for v, i, d in db.execute(
            "SELECT version, schema_id, deleted FROM sr_versions WHERE subject=?"
            " ORDER BY version", (subject,))]

    @staticmethod
    def subjects(db: Connection, deleted: bool) -> list[str]:
        where = "" if deleted else " WHERE deleted=0"
        return [s for (s,) in db.execute(
            f"SELECT DISTINCT subject FROM sr_versions{where} ORDER BY subject")]

    @staticmethod
    def versions_of_schema(db: Connection, schema_id: int, deleted: bool) -> list[VersionRow]:
        where = "" if deleted else " AND deleted=0"
        return [VersionRow(s, int(v), schema_id, bool(d)) for s, v, d in db.execute(
            f"SELECT subject, version, deleted FROM sr_versions WHERE schema_id=?{where}"
            " ORDER BY subject, version", (schema_id,))]

    @staticmethod
    def referenced_by(db: Connection, subject: str, version: int) -> list[int]:
        """Ids of live schemas whose references name subject/version."""
        out = []
        for sid, refs in db.execute(
                "SELECT DISTINCT s.id, s.refs FROM sr_schemas s JOIN sr_versions v"
                " ON v.schema_id = s.id WHERE s.refs <> '[]' ORDER BY s.id"):
            if any(r.subject == subject and r.version == version for r in _refs(refs)):
                out.append(int(sid))
        return out

    @staticmethod
    def config(db: Connection, subject: str) -> str | None:
        row = db.execute("SELECT compatibility FROM sr_config WHERE subject=?",
                         (subject,)).fetchone()
        return None if row is None else str(row[0])

    # -- writes (inside run(write=True)) -----------------------------------------------------
    @staticmethod
    def insert_schema(db: Connection, schema_type: str, text: str,
                      refs: tuple[Reference, ...], fingerprint: str) -> int:
        (value,) = db.execute("SELECT value FROM meta WHERE key='schema_registry.next_id'"
                              ).fetchone()
        schema_id = int(value)
        db.execute("UPDATE meta SET value=? WHERE key='schema_registry.next_id'",
                   (str(schema_id + 1),))
        db.execute("INSERT INTO sr_schemas(id, schema_type, schema, refs, fingerprint)"
                   " VALUES (?,?,?,?,?)", (schema_id, schema_type, text,
                                           json.dumps([r.to_json() for r in refs]), fingerprint))
        return schema_id

    @staticmethod
    def insert_version(db: Connection, subject: str, version: int, schema_id: int) -> None:
        db.execute("INSERT INTO sr_versions(subject, version, schema_id, deleted)"
                   " VALUES (?,?,?,0)", (subject, version, schema_id))

    @staticmethod
    def set_deleted(db: Connection, subject: str, versions: list[int]) -> None:
        db.executemany("UPDATE sr_versions SET deleted=1 WHERE subject=? AND version=?",
                       [(subject, v) for v in versions])

    @staticmethod
    def remove_versions(db: Connection, subject: str, versions: list[int]) -> None:
        db.executemany("DELETE FROM sr_versions WHERE subject=? AND version=?",
                       [(subject, v) for v in versions])

    @staticmethod
    def set_config(db: Connection, subject: str, level: str | None) -> None:
        if level is None:
            db.execute("DELETE FROM sr_config WHERE subject=?", (subject,))
        else:
            db.execute("INSERT INTO sr_config(subject, compatibility) VALUES (?,?)"
                       " ON CONFLICT (subject) DO UPDATE SET compatibility=excluded.compatibility",
                       (subject, level))
