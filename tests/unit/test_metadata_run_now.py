"""The WAL's commits on the event loop's thread (StoreBase._run_now): only on a local database
(SQLite), only while the store's own thread has nothing queued or running, never waiting on
the loop for another connection's lock. What must hold: every commit still commits once, in
the order calls were made, and the loop keeps running while another writer holds the lock."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from s3stream.metadata import ChunkRow, MetadataStore, ObjectCommit
from s3stream.metadata.backend import Connection, LockBusyError
from s3stream.metadata.sqlite import BUSY_TIMEOUT_S, SqliteBackend
from tests.unit.test_metadata_store import opened


@dataclass
class WhereApplied:
    """An attachment that writes nothing and notes the thread its commit ran on."""

    threads: list[str] = field(default_factory=list)

    def apply(self, db: Connection, live: set[int]) -> None:
        self.threads.append(threading.current_thread().name)

    def undo(self, db: Connection, undone: list[ChunkRow]) -> None:
        return None


@pytest.fixture
async def store(metadata_url: str) -> AsyncIterator[MetadataStore]:
    async with opened(metadata_url) as s:
        yield s


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[MetadataStore]:
    async with opened(f"sqlite:///{tmp_path / 'meta.db'}") as s:
        yield s


async def loop_ticks(seconds: float) -> int:
    """How many 10 ms sleeps the event loop got through in `seconds` (none while held)."""
    ticks = 0
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        await asyncio.sleep(0.01)
        ticks += 1
    return ticks


async def commit(store: MetadataStore, sid: int, base: int, last: int,
                 where: WhereApplied, oid: int | None = None) -> None:
    oid = oid if oid is not None else await store.reserve_object_ids(1)
    await store.commit_objects([ObjectCommit(
        oid, f"wal/{oid}", 10, [ChunkRow(sid, base, last, oid, 0, 10, 0)], [where])])


async def test_a_commit_runs_on_the_loop_only_on_a_local_database(
    store: MetadataStore,
) -> None:
    (s,) = await store.create_streams(1)
    where = WhereApplied()
    before = store.ran_now
    for i in range(5):
        await commit(store, s.stream_id, 10 * i, 10 * i + 9, where)
    streams, chunks = await store.load()
    assert streams[0].end_offset == 50 and len(chunks) == 5
    if store.backend.local:  # SQLite: on this (the loop's) thread, ids reserved there too
        assert where.threads == [threading.current_thread().name] * 5
        assert store.ran_now - before == 10 and store.ran_now_busy == 0
    else:  # PostgreSQL: a round trip per statement, never on the loop
        assert all(t.startswith("floe-meta") for t in where.threads), where.threads
        assert store.ran_now == 0


async def test_the_commit_itself_is_made_on_the_stores_thread(
    sqlite_store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statements run on the loop, the COMMIT (SQLite's fsync) on the store's thread:
    a slow disk holds the commit's caller, never the loop; a caller cancelled meanwhile
    leaves no transaction open."""
    store = sqlite_store
    (s,) = await store.create_streams(1)
    commits: list[str] = []
    real = store._commit

    def slow_commit(*args: object) -> None:
        commits.append(threading.current_thread().name)
        time.sleep(0.3)  # the disk taking its time
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_commit", slow_commit)
    where = WhereApplied()
    committing = asyncio.ensure_future(commit(store, s.stream_id, 0, 9, where, oid=1000))
    assert await loop_ticks(0.2) >= 8  # the loop ran during the COMMIT
    assert not committing.done()
    await asyncio.wait_for(committing, 10)
    assert where.threads == [threading.current_thread().name]
    assert commits and all(t.startswith("floe-meta") for t in commits), commits
    # cancelled while its COMMIT is under way: committed all the same, nothing left open
    cancelled = asyncio.ensure_future(commit(store, s.stream_id, 10, 19, where, oid=1001))
    await asyncio.sleep(0.1)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    monkeypatch.setattr(store, "_commit", real)
    await commit(store, s.stream_id, 20, 29, where, oid=1002)
    streams, chunks = await store.load()
    assert streams[0].end_offset == 30 and len(chunks) == 3


async def test_a_call_pending_on_the_stores_thread_keeps_the_commit_behind_it(
    sqlite_store: MetadataStore,
) -> None:
    """While the thread runs (or has queued) a call, a commit goes behind it: the connection
    is never used by two threads at once and calls keep their order."""
    store = sqlite_store
    (s,) = await store.create_streams(1)
    release = threading.Event()
    order: list[str] = []

    def slow() -> None:
        assert release.wait(10)
        order.append("slow")

    blocking = asyncio.ensure_future(store._run(slow))
    await asyncio.sleep(0.05)
    where = WhereApplied()
    committing = asyncio.ensure_future(commit(store, s.stream_id, 0, 9, where, oid=1000))
    await asyncio.sleep(0.2)
    assert not committing.done(), "the commit did not wait for the call before it"
    release.set()
    await asyncio.wait_for(asyncio.gather(blocking, committing), 10)
    assert order == ["slow"] and where.threads[0].startswith("floe-meta")
    # the thread idle again: the next commit runs on the loop
    await commit(store, s.stream_id, 10, 19, where)
    assert where.threads[1] == threading.current_thread().name


async def test_a_call_cancelled_before_it_started_does_not_keep_commits_off_the_loop(
    sqlite_store: MetadataStore,
) -> None:
    store = sqlite_store
    (s,) = await store.create_streams(1)
    release = threading.Event()
    blocking = asyncio.ensure_future(store._run(release.wait, 10))
    queued = asyncio.ensure_future(store._run(time.sleep, 0))
    await asyncio.sleep(0.05)
    queued.cancel()  # still queued behind the blocking call: never runs
    await asyncio.sleep(0)
    release.set()
    await asyncio.wait_for(blocking, 10)
    with pytest.raises(asyncio.CancelledError):
        await queued
    where = WhereApplied()
    await commit(store, s.stream_id, 0, 9, where)
    assert where.threads == [threading.current_thread().name]


async def test_another_writers_lock_sends_the_commit_to_the_thread_not_the_loop(
    sqlite_store: MetadataStore, tmp_path: Path
) -> None:
    """Another connection (another store of the process, another broker on the same file)
    holds the write lock: the commit waits for it on the store's thread while the loop goes
    on, then commits once, seeing the other writer's end offset."""
    store = sqlite_store
    other = sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
    try:
        (s,) = await store.create_streams(1)
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE streams SET end_offset=10 WHERE stream_id=?", (s.stream_id,))
        where = WhereApplied()
        committing = asyncio.ensure_future(commit(store, s.stream_id, 10, 19, where, oid=1))
        assert await loop_ticks(0.3) >= 10  # the loop is not held by the commit
        assert not committing.done()
        other.execute("COMMIT")
        await asyncio.wait_for(committing, 10)
        assert store.ran_now_busy >= 1 and where.threads[0].startswith("floe-meta")
        streams, chunks = await store.load()
        assert streams[0].end_offset == 20
        assert [(c.base_offset, c.last_offset) for c in chunks] == [(10, 19)]
    finally:
        other.close()


def test_no_waiting_fails_at_once_and_the_busy_timeout_comes_back(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    db = SqliteBackend(path).connect()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        with pytest.raises(LockBusyError), db.no_waiting():
            db.execute("BEGIN IMMEDIATE")
        assert time.monotonic() - began < 1
        assert db.execute("PRAGMA busy_timeout").fetchone() == (int(BUSY_TIMEOUT_S * 1000),)
        # outside it, BEGIN waits for the other writer as it always did
        threading.Timer(0.2, other.execute, ("COMMIT",)).start()
        db.execute("BEGIN IMMEDIATE")
        assert time.monotonic() - began >= 0.2
        db.execute("COMMIT")
    finally:
        other.close()
        db.close()
