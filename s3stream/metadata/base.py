"""The store's plumbing: one thread, one connection, transactions, reconnection.

Every database call runs on one dedicated thread (`_run`), so the connection is never shared
and calls apply in the order they were made. Write transactions go through `_txn`. How long
calls wait for that thread (behind other calls: heartbeats, offset commits, table work) is
counted in `queue_seconds` (the metric floe_metadata_queue_seconds).

The WAL's commits are the exception where the database is a local file (SQLite, `_run_now`):
when the store's thread has nothing queued or running and no other connection holds the write
lock, the transaction's statements run right away on the event loop's thread, and only its
COMMIT (the fsync) goes to the store's thread. Handing all of it to the thread cost more than
the transaction: the thread takes the GIL back after every statement (about ten per commit),
and while the loop is busy each time waits for the loop to let go of it (up to the 5 ms
switch interval). Measured (issue 17, fixed 10 MiB/s produce, file store, 2 vCPUs, runs
alternated against the thread doing all of it): all of it on the loop, WAL flush mean
15.6/12.4/10.6/16.1 -> 10.4/5.4/4.3/4.6 ms and client p99 128/112/64/160 -> 114/40/42/37
ms; the COMMIT on the thread as now, flush 12.1/9.3/8.7 -> 9.0/6.6/10.2 ms and p99
60.5/51.1/42.3 -> 47.1/39.5/54.5 ms, and no different from all of it on the loop in 3
pairs, while a slow disk then holds only the commit's caller, never the loop. Should another
connection hold the lock (another store of this process, another broker sharing the file),
the call goes to the thread and waits there. The order of calls still holds: one runs on the
loop only when none is pending, and its COMMIT is queued before any later call.

Connection loss (the PostgreSQL server restarted, the network dropped):
- The store notices on the next statement, drops the connection and connects again on its
  next call; nothing has to be restarted.
- A call that finds its connection dead before its transaction's COMMIT changed nothing (the
  server aborts a transaction whose client went away; the few writes that are one statement
  outside a transaction are idempotent). If the connection had been opened by
  an earlier call (it went stale in between, e.g. a server restart between two calls) the call
  runs once more on a new connection; otherwise, or if that fails too, it raises
  MetadataUnavailableError, whose `retriable` is True.
- A connection lost during COMMIT leaves the outcome unknown: the call raises
  CommitInDoubtError (a MetadataUnavailableError) and is never re-run by the store. Callers
  treat it as "not done", and for the operations where a stray commit would contradict the
  caller's state (commit_object, replace_chunks) the store makes that true: it remembers the
  transaction id, asks the server on its next call whether it committed, and if so undoes it
  in a new transaction before that call runs (should the old session still be committing,
  its row locks make later commits wait, and the question is asked again on the next call).

The log layer relies on this: a commit_object that raises is a failed flush. LogStore fails
the pending appends of those streams with StreamWriteError (a retriable error for producers)
and rewinds them to their durable end offset. Nothing acknowledged is lost, since an append is
acknowledged only after commit_object returned, and the undo keeps the metadata's end offset
where the log layer rewound to, so the stream's next commit passes the offset guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from s3stream.metadata.backend import Backend, Connection, LockBusyError
from s3stream.metadata.migrations import STORE, Component, run_migrations
from s3stream.metadata.model import (
    CommitInDoubtError,
    MetadataError,
    MetadataUnavailableError,
    TransactionRetryError,
)
from s3stream.stats import LATENCY_BUCKETS, Histogram

T = TypeVar("T")
log = logging.getLogger(__name__)

TXN_ATTEMPTS = 5  # runs of a transaction the server aborted to break a deadlock


def marks(n: int) -> str:
    """`?,?,?` for an IN list of n values (`NULL`, matching nothing, for none)."""
    return ",".join("?" * n) or "NULL"


class StoreBase:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-meta")
        self._db: Connection | None = None
        self._opened = False
        self._in_doubt: list[tuple[str, Callable[[], None]]] = []
        # from a call's submission to its start on the store's thread (0 for `_run_now`'s
        # calls made on the event loop's thread)
        self.queue_seconds = Histogram(LATENCY_BUCKETS)
        # calls handed to the thread (counted by the loop's thread), and those of them done
        self._submitted = 0
        self._finished = 0
        self._finished_lock = threading.Lock()
        self.ran_now = 0  # `_run_now` calls made on the loop's thread
        self.ran_now_busy = 0  # and those that found another connection's lock and went on
        self._commit_later = False  # set by `_run_now`: `_txn` leaves its COMMIT to it
        self._pending: Connection | None = None  # the connection whose COMMIT was left

    @property
    def db(self) -> Connection:
        assert self._db is not None, "metadata store not open"
        return self._db

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._submit(self._started, time.monotonic(), fn,
                                                      *args))

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue fn on the store's thread, counted until it has finished (or was cancelled
        before it started): the thread is idle when every call submitted has."""
        self._submitted += 1
        f = self._pool.submit(fn, *args)
        f.add_done_callback(self._one_finished)
        return f

    def _one_finished(self, _: Future[Any]) -> None:
        with self._finished_lock:  # the store's thread, or the loop's when cancelled
            self._finished += 1

    def _started(self, submitted: float, fn: Callable[..., T], *args: Any) -> T:
        self.queue_seconds.observe(time.monotonic() - submitted)
        return self._call(fn, *args)

    async def _run_now(self, fn: Callable[..., T], *args: Any) -> T:
        """`_run` for the WAL's short transactions. On a local backend, with no call of the
        store's thread queued or running (so the connection is free and the order of calls
        holds) and the write lock free, `fn` runs here, on the event loop's thread, without
        waiting for any lock, up to its COMMIT, which the store's thread makes; otherwise
        (or when a statement finds a lock taken, which rolls the transaction back) it goes to
        the thread as any call (see the module docstring). `fn` must be one write
        transaction and nothing else, so that running it again after a LockBusyError is
        running it once, and its result is final once its COMMIT succeeds."""
        if self.backend.local and self._opened and self._submitted == self._finished:
            self.ran_now += 1
            self._commit_later = True  # only while fn runs: the store's thread is idle then
            try:
                db = self._connection()
                with db.no_waiting():
                    result = self._call(fn, *args)
                ran = True
            except LockBusyError:
                self.ran_now_busy += 1
                ran = False
            finally:
                self._commit_later = False
            if ran:
                self.queue_seconds.observe(0.0)
                # its COMMIT (the database's fsync) on the store's thread, queued before any
                # other call: the loop never waits for the disk. Shielded: a cancelled caller
                # must not leave the transaction open (the COMMIT happens; as with `_run`,
                # a call cancelled once running still has its effect)
                await asyncio.shield(asyncio.wrap_future(self._submit(self._commit_pending)))
                return result
        return await self._run(fn, *args)

    def _commit_pending(self) -> None:
        """COMMIT the transaction `_run_now` left open on the connection (store's thread)."""
        db, self._pending = self._pending, None
        if db is None:  # fn ended without a write transaction (nothing to commit)
            return
        self._commit(db)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn on the store's thread with a live connection (see the module docstring)."""
        conflicts = 0
        while True:
            stale_possible = self._db is not None
            try:
                self._connection()
                return fn(*args)
            except CommitInDoubtError:
                self._disconnect()
                raise
            except MetadataUnavailableError:
                self._disconnect()
                if not stale_possible:
                    raise
                log.info("metadata connection was lost; connecting again")
            except TransactionRetryError:
                conflicts += 1
                if conflicts >= TXN_ATTEMPTS:
                    raise

    def _connection(self) -> Connection:
        if not self._opened:
            raise MetadataError("metadata store not open")
        if self._db is None:
            self._db = self.backend.connect()
        if self._in_doubt:
            self._resolve_in_doubt()
        return self._db

    def _disconnect(self) -> None:
        if self._db is not None:
            with contextlib.suppress(Exception):
                self._db.close()
            self._db = None

    def _resolve_in_doubt(self) -> None:
        while self._in_doubt:
            txid, undo = self._in_doubt[0]
            status = self.db.transaction_status(txid)
            if status == "in progress":  # the old session is still finishing its COMMIT
                return
            if status == "committed":
                log.warning("metadata transaction %s committed after all; undoing it", txid)
                try:
                    undo()
                except (MetadataUnavailableError, TransactionRetryError):
                    raise  # keep it: try again on the next call
                except Exception:
                    log.exception("could not undo metadata transaction %s", txid)
            elif status is None:
                log.warning("the outcome of metadata transaction %s is unknown", txid)
            self._in_doubt.pop(0)

    @contextlib.contextmanager
    def _txn(
        self, undo: Callable[[], None] | None = None, read_only: bool = False
    ) -> Iterator[Connection]:
        """One transaction. A write transaction takes its locks per the dialect (SQLite: the
        database's, up front; PostgreSQL: the rows it reads with `self.for_update`).
        `undo` reverses the transaction's effect should it commit although COMMIT failed."""
        db = self.db
        if self._pending is not None:
            raise RuntimeError("a transaction began before the COMMIT left by _run_now")
        dialect = self.backend.dialect
        db.execute(dialect.begin_read if read_only else dialect.begin_write)
        try:
            txid = db.transaction_id() if undo is not None else None
            yield db
        except BaseException:
            with contextlib.suppress(Exception):
                db.execute("ROLLBACK")
            raise
        if self._commit_later and not read_only:
            self._pending = db  # `_run_now` has the store's thread COMMIT it
            return
        self._commit(db, read_only, txid, undo)

    def _commit(self, db: Connection, read_only: bool = False, txid: str | None = None,
                undo: Callable[[], None] | None = None) -> None:
        try:
            db.execute("COMMIT")
        except BaseException as e:
            with contextlib.suppress(Exception):
                db.execute("ROLLBACK")  # SQLite keeps a transaction whose COMMIT was busy
            if read_only or not isinstance(e, MetadataUnavailableError):
                raise
            if txid is not None and undo is not None:
                self._in_doubt.append((txid, undo))
            raise CommitInDoubtError(f"connection lost during COMMIT: {e}") from e

    @property
    def for_update(self) -> str:
        return self.backend.dialect.for_update

    def _lock_streams(self, db: Connection, stream_ids: Iterable[int]) -> dict[int, int]:
        """Lock the live streams among stream_ids until COMMIT and return their end offsets.
        Always in id order, so two transactions locking several streams cannot deadlock."""
        ids = sorted(set(stream_ids))
        return dict(db.execute(
            "SELECT stream_id, end_offset FROM streams WHERE deleted=0 AND stream_id IN"
            f" ({marks(len(ids))}) ORDER BY stream_id{self.for_update}", ids).fetchall())

    # -- lifecycle -------------------------------------------------------------------------
    def _create_schema(self, new_cluster_id: str) -> None:
        """Migrate the store's tables (see .migrations; SchemaTooNewError for a database
        written by a newer floe, which is left untouched), then give it a cluster id."""
        run_migrations(self._txn, self.backend.dialect, STORE)
        with self._txn() as db:
            db.execute("INSERT INTO meta(key, value) VALUES ('cluster_id', ?)"
                       " ON CONFLICT DO NOTHING", (new_cluster_id,))

    def _migrate(self, component: Component) -> int:
        return run_migrations(self._txn, self.backend.dialect, component)

    async def migrate(self, component: Component) -> int:
        """Bring another component's tables (e.g. the Schema Registry's) to their latest
        version in this database (see .migrations); returns that version."""
        return await self._run(self._migrate, component)

    async def open(self) -> None:
        self._opened = True
        await self._run(self._create_schema, uuid.uuid4().hex[:22])

    def _close(self) -> None:
        self._opened = False
        self._disconnect()

    async def close(self) -> None:
        await asyncio.wrap_future(self._submit(self._close))
        self._pool.shutdown(wait=True)
