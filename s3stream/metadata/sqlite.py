"""SQLite: the embedded backend (`sqlite:///path/meta.db`), one file, WAL journal."""

from __future__ import annotations

import sqlite3
import time
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


BUSY_TIMEOUT_S = 10.0
WAL_MODE_TRIES = 100


def _wal_mode(db: sqlite3.Connection) -> None:
    """Switch the database to WAL mode (kept in the file, so a no-op once done). Connections
    opening a new database together race for the lock that switch takes, and SQLite answers
    "database is locked" at once, without waiting, to the one whose wait could deadlock: so
    try again a little later, a bounded number of times (a clean-clone CI run saw four stores
    opening one new database fail so)."""
    for attempt in range(WAL_MODE_TRIES):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == WAL_MODE_TRIES - 1:
                raise
            time.sleep(0.01 + 0.002 * attempt)


class SqliteBackend(Backend):
    dialect = SQLITE

    def __init__(self, path: Path) -> None:
        self.path = path

    def connect(self) -> Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                             timeout=BUSY_TIMEOUT_S)
        try:
            _wal_mode(db)
            db.execute("PRAGMA synchronous=FULL")
        except BaseException:
            db.close()
            raise
        return SqliteConnection(db)

    def describe(self) -> str:
        return f"sqlite:///{self.path}"
