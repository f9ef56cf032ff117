"""SQLite: the embedded backend (`sqlite:///path/meta.db`), one file, WAL journal."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from s3stream.metadata.backend import Backend, Connection, Cursor, Dialect
from s3stream.metadata.model import MetadataError

SQLITE = Dialect(
    int_type="INTEGER",  # SQLite integers are 64-bit; INTEGER PRIMARY KEY aliases the rowid
    identity="INTEGER PRIMARY KEY AUTOINCREMENT",
    without_rowid=" WITHOUT ROWID",
    begin_write="BEGIN IMMEDIATE",  # take the database's write lock up front
    begin_read="BEGIN",
    for_update="",  # the database-wide write lock already guards every row
    schema_lock=None,
    table_exists="SELECT max(name) FROM sqlite_master WHERE type='table' AND name=?",
)


class SqliteConnection(Connection):
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.IntegrityError as e:
            raise MetadataError(str(e)) from e

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self._db.executemany(sql, rows)
        except sqlite3.IntegrityError as e:
            raise MetadataError(str(e)) from e

    def close(self) -> None:
        self._db.close()


class SqliteBackend(Backend):
    dialect = SQLITE

    def __init__(self, path: Path) -> None:
        self.path = path

    def connect(self) -> Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=10000")
        return SqliteConnection(db)

    def describe(self) -> str:
        return f"sqlite:///{self.path}"
