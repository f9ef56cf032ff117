"""What differs between the SQL databases the store runs on: a dialect and a connection.

The store writes its SQL once, with `?` placeholders and the upsert spelling both SQLite and
PostgreSQL accept (`INSERT ... ON CONFLICT ... DO UPDATE/NOTHING`, `RETURNING`). What is left
differs per backend and lives here:
- the schema's integer and identity column types and SQLite's WITHOUT ROWID (the `Dialect`);
- how a write transaction takes its locks: SQLite locks the whole database up front
  (BEGIN IMMEDIATE); PostgreSQL runs READ COMMITTED transactions that lock the rows they
  guard with SELECT ... FOR UPDATE (`Dialect.for_update`), so a guard (a stream's end offset)
  read under the lock stays true until COMMIT;
- the placeholder style and how driver errors map onto the store's errors (the `Connection`);
- whether a call may run on the event loop's thread (`Backend.local`: a file on this machine,
  no round trip) and how a statement is told not to wait for another connection's lock
  (`Connection.no_waiting`): see StoreBase._run_now.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

# Migration 1's tables, as they were when versions started being recorded (see .migrations:
# later migrations change them; the Kafka tables here now belong to broker.metadata).
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS topics(
    name TEXT PRIMARY KEY, topic_id TEXT NOT NULL, configs TEXT NOT NULL,
    created_ms {int} NOT NULL);
CREATE TABLE IF NOT EXISTS streams(
    stream_id {identity}, topic TEXT NOT NULL,
    partition {int} NOT NULL, start_offset {int} NOT NULL DEFAULT 0,
    end_offset {int} NOT NULL DEFAULT 0, epoch {int} NOT NULL DEFAULT 0,
    deleted {int} NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS streams_live ON streams(topic, partition) WHERE deleted = 0;
CREATE TABLE IF NOT EXISTS objects(
    object_id {int} PRIMARY KEY, key TEXT NOT NULL, size {int} NOT NULL,
    kind TEXT NOT NULL, created_ms {int} NOT NULL);
CREATE TABLE IF NOT EXISTS chunks(
    stream_id {int} NOT NULL, base_offset {int} NOT NULL, last_offset {int} NOT NULL,
    object_id {int} NOT NULL, position {int} NOT NULL, length {int} NOT NULL,
    max_timestamp {int} NOT NULL, PRIMARY KEY(stream_id, base_offset)){without_rowid};
CREATE TABLE IF NOT EXISTS producer_batches(
    stream_id {int} NOT NULL, producer_id {int} NOT NULL, epoch {int} NOT NULL,
    first_seq {int} NOT NULL, last_seq {int} NOT NULL, base_offset {int} NOT NULL,
    last_offset {int} NOT NULL,
    PRIMARY KEY(stream_id, producer_id, base_offset)){without_rowid};
CREATE TABLE IF NOT EXISTS group_offsets(
    group_id TEXT NOT NULL, topic TEXT NOT NULL, partition {int} NOT NULL,
    committed_offset {int} NOT NULL, leader_epoch {int} NOT NULL, metadata TEXT,
    commit_ms {int} NOT NULL, PRIMARY KEY(group_id, topic, partition)){without_rowid};
"""


@dataclass(frozen=True)
class Dialect:
    int_type: str  # a 64-bit integer column
    identity: str  # an auto-numbered 64-bit primary key column
    without_rowid: str  # table suffix for tables clustered on their primary key
    begin_write: str  # starts a write transaction
    begin_read: str  # starts a read-only transaction that sees one consistent snapshot
    for_update: str  # appended to a SELECT to lock the rows it returns until COMMIT
    schema_lock: str | None  # run first in the schema transaction (brokers starting together)
    table_exists: str  # one row, one column: not NULL iff the table named by `?` exists

    def schema(self) -> list[str]:
        text = SCHEMA.format(int=self.int_type, identity=self.identity,
                             without_rowid=self.without_rowid)
        return [s.strip() for s in text.split(";") if s.strip()]


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class LockBusyError(Exception):
    """Inside `Connection.no_waiting`: a statement needed a lock another connection holds
    (nothing of the transaction is committed: the store rolls it back)."""


class Connection(ABC):
    """One database connection in autocommit mode (transactions are explicit BEGIN/COMMIT).

    SQL uses `?` placeholders. Errors come out as the store's: MetadataUnavailableError when
    the connection is gone, TransactionRetryError when the server aborted the transaction to
    resolve a conflict, MetadataError for constraint violations; anything else is a bug and
    passes through unchanged."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    @abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        """Run `sql` once per row; the number of rows the runs changed, summed."""

    @abstractmethod
    def close(self) -> None: ...

    def transaction_id(self) -> str | None:
        """Inside a transaction: an id to ask `transaction_status` about after losing the
        connection during COMMIT. None where COMMIT cannot be in doubt (an embedded database)."""
        return None

    def transaction_status(self, txid: str) -> str | None:
        """'committed', 'aborted', 'in progress', or None when the server no longer knows."""
        return None

    @contextlib.contextmanager
    def no_waiting(self) -> Iterator[None]:
        """Statements inside raise LockBusyError at once where they would wait for a lock held
        by another connection. Only backends that are `local` implement it."""
        raise NotImplementedError(f"{type(self).__name__} always waits for locks")
        yield  # unreachable: makes this a generator, as the override is


class Backend(ABC):
    dialect: Dialect
    # the database is a file on this machine (SQLite): a short call costs no round trip and
    # may run on the event loop's thread when nothing waits for it (StoreBase._run_now)
    local: bool = False

    @abstractmethod
    def connect(self) -> Connection:
        """A new connection; raises MetadataUnavailableError when the server is unreachable."""

    @abstractmethod
    def describe(self) -> str:
        """Where the database is, for logs (no password)."""


def redact_url(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{hostport}"))
