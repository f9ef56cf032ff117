"""SQLite: the embedded backend (`sqlite:///path/meta.db`), one file, WAL journal."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from s3stream.metadata.backend import Backend, Connection, Cursor, Dialect, LockBusyError
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
        self._no_wait = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.IntegrityError as e:
            raise MetadataError(str(e)) from e
        except sqlite3.OperationalError as e:
            if self._lock_busy(e):
                raise LockBusyError(str(e)) from e
            raise

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        try:
            return self._db.executemany(sql, rows).rowcount  # summed by sqlite3
        except sqlite3.IntegrityError as e:
            raise MetadataError(str(e)) from e
        except sqlite3.OperationalError as e:
            if self._lock_busy(e):
                raise LockBusyError(str(e)) from e
            raise

    def _lock_busy(self, e: sqlite3.OperationalError) -> bool:
        """SQLITE_BUSY or SQLITE_LOCKED (any extended code) inside `no_waiting` (outside it,
        such an error comes after the busy timeout and passes through, as it always did)."""
        code = getattr(e, "sqlite_errorcode", 0) & 0xFF
        return self._no_wait and code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)

    @contextlib.contextmanager
    def no_waiting(self) -> Iterator[None]:
        """A busy timeout of 0 inside: SQLite answers SQLITE_BUSY at once where it would
        have retried for up to BUSY_TIMEOUT_S (BEGIN IMMEDIATE while another connection
        writes; WAL mode's readers never wait)."""
        self._db.execute("PRAGMA busy_timeout=0")
        self._no_wait = True
        try:
            yield
        finally:
            self._no_wait = False
            self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")

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
    local = True

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
