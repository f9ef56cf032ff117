"""The s3stream metadata store's behaviour (streams, objects, chunks, commit attachments), the
same on every backend (SQLite and PostgreSQL). The broker's Kafka tables: test_kafka_metadata."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from s3stream.metadata import (
    ChunkRow,
    CommitAttachment,
    MetadataError,
    MetadataStore,
    MetadataUnavailableError,
    ObjectCommit,
    ObjectRow,
    OffsetConflictError,
    open_metadata_store,
)
from s3stream.metadata.backend import Connection
from s3stream.metadata.postgres import IDLE_IN_TRANSACTION_S, PostgresBackend


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[MetadataStore]:
    store = open_metadata_store(url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def store(metadata_url: str) -> AsyncIterator[MetadataStore]:
    async with opened(metadata_url) as s:
        yield s


def chunk(sid: int, base: int, last: int, oid: int, ts: int = 0) -> ChunkRow:
    return ChunkRow(sid, base, last, oid, 24, 10 * (last - base + 1), ts)


async def commit(store: MetadataStore, sid: int, base: int, last: int,
                 attachments: list[CommitAttachment] | None = None) -> int:
    oid = await store.reserve_object_ids(1)
    await store.commit_object(oid, f"wal/{oid}", 100, [chunk(sid, base, last, oid)],
                              attachments or [])
    return oid


async def test_streams_create_and_delete(store: MetadataStore) -> None:
    streams = await store.create_streams(3)
    assert [(s.start_offset, s.end_offset) for s in streams] == [(0, 0)] * 3
    assert len({s.stream_id for s in streams}) == 3
    await commit(store, streams[0].stream_id, 0, 4)
    await store.delete_streams([streams[0].stream_id, streams[2].stream_id])
    live, chunks = await store.load()
    assert [s.stream_id for s in live] == [streams[1].stream_id] and chunks == []
    # a deleted stream's id is never handed out again
    (again,) = await store.create_streams(1)
    assert again.stream_id not in {s.stream_id for s in streams} and again.end_offset == 0


async def test_cluster_id_and_counters_survive_reopen(metadata_url: str) -> None:
    async with opened(metadata_url) as s:
        cid = await s.cluster_id()
        first = await s.reserve_object_ids(64)
        second = await s.reserve_object_ids(10)
        assert first == 1 and second == 65
    async with opened(metadata_url) as s:
        assert await s.cluster_id() == cid and len(cid) == 22
        assert await s.reserve_object_ids(1) == 75


async def test_object_ids_from_concurrent_stores_never_overlap(metadata_url: str) -> None:
    async with opened(metadata_url) as a, opened(metadata_url) as b:
        firsts = await asyncio.gather(*(s.reserve_object_ids(8) for s in [a, b] * 10))
    ranges = sorted(firsts)
    assert all(y - x >= 8 for x, y in itertools.pairwise(ranges))


async def test_commit_object_guard(store: MetadataStore) -> None:
    (s0, s1) = await store.create_streams(2)
    await commit(store, s0.stream_id, 0, 9)
    with pytest.raises(OffsetConflictError):  # the same offset again
        await commit(store, s0.stream_id, 0, 9)
    with pytest.raises(OffsetConflictError):  # a gap
        await commit(store, s0.stream_id, 11, 12)
    # one stream's conflict fails the whole object: nothing of it is committed
    with pytest.raises(OffsetConflictError):
        await store.commit_object(50, "wal/50", 100, [chunk(s1.stream_id, 0, 4, 50),
                                                      chunk(s0.stream_id, 5, 9, 50)])
    streams, chunks = await store.load()
    assert {s.stream_id: s.end_offset for s in streams} == {s0.stream_id: 10, s1.stream_id: 0}
    assert [(c.stream_id, c.base_offset, c.last_offset) for c in chunks] == [
        (s0.stream_id, 0, 9)]
    assert 50 not in await store.object_keys()
    # a deleted stream's chunk is dropped, the others commit
    (gone,) = await store.create_streams(1)
    await store.delete_streams([gone.stream_id])
    live = await store.commit_object(60, "wal/60", 100, [chunk(s0.stream_id, 10, 19, 60),
                                                         chunk(gone.stream_id, 0, 3, 60)])
    assert live == {s0.stream_id}
    assert (await store.object_keys())[60] == "wal/60"


async def test_racing_commits_to_one_stream_exactly_one_wins(metadata_url: str) -> None:
    async with opened(metadata_url) as a, opened(metadata_url) as b:
        (s,) = await a.create_streams(1)
        end = 0
        for round_ in range(15):
            oids = [1000 + 2 * round_, 1001 + 2 * round_]
            results = await asyncio.gather(
                a.commit_object(oids[0], "wal/a", 1, [chunk(s.stream_id, end, end + 4, oids[0])]),
                b.commit_object(oids[1], "wal/b", 1, [chunk(s.stream_id, end, end + 9, oids[1])]),
                return_exceptions=True,
            )
            won = [r for r in results if not isinstance(r, BaseException)]
            lost = [r for r in results if isinstance(r, BaseException)]
            assert len(won) == 1 and len(lost) == 1, results
            assert isinstance(lost[0], OffsetConflictError)
            end += 5 if results[0] == {s.stream_id} else 10
        streams, chunks = await a.load()
    assert streams[0].end_offset == end
    assert [c.base_offset for c in chunks] == [0] + [c.last_offset + 1 for c in chunks[:-1]]


async def test_many_writers_keep_a_dense_log(metadata_url: str) -> None:
    """Writers that reload the end offset after each conflict, as a failed-over broker
    would: every offset is committed exactly once."""
    async with opened(metadata_url) as setup:
        (s,) = await setup.create_streams(1)

    async def writer(n: int) -> int:
        async with opened(metadata_url) as store:
            done = 0
            while done < 8:
                streams, _ = await store.load()
                end = streams[0].end_offset
                oid = await store.reserve_object_ids(1)
                try:
                    await store.commit_object(oid, f"wal/{oid}", 1,
                                              [chunk(s.stream_id, end, end + n, oid)])
                    done += 1
                except OffsetConflictError:
                    pass
            return done

    assert await asyncio.gather(*(writer(n) for n in range(4))) == [8] * 4
    async with opened(metadata_url) as check:
        streams, chunks = await check.load()
    assert len(chunks) == 32
    assert [c.base_offset for c in chunks] == [0] + [c.last_offset + 1 for c in chunks[:-1]]
    assert streams[0].end_offset == chunks[-1].last_offset + 1


async def test_a_commit_waiting_for_another_writers_lock_sees_its_end_offset(
    store: MetadataStore,
) -> None:
    """The guard is read under the lock: a commit that had to wait does not act on the end
    offset from before the other writer's COMMIT."""
    (s,) = await store.create_streams(1)
    other = store.backend.connect()
    try:
        other.execute(store.backend.dialect.begin_write)
        other.execute("UPDATE streams SET end_offset=? WHERE stream_id=?", (5, s.stream_id))
        attempt = asyncio.ensure_future(
            store.commit_object(9, "wal/9", 1, [chunk(s.stream_id, 0, 4, 9)]))
        await asyncio.sleep(0.3)
        assert not attempt.done(), "the commit did not wait for the other writer"
        other.execute("COMMIT")
        with pytest.raises(OffsetConflictError):
            await asyncio.wait_for(attempt, 15)
    finally:
        other.close()
    streams, chunks = await store.load()
    assert streams[0].end_offset == 5 and chunks == []


async def test_load_returns_chunks_in_order_from_the_start_offset(store: MetadataStore) -> None:
    (a, b) = await store.create_streams(2)
    for base in range(0, 30, 10):
        await commit(store, b.stream_id, base, base + 9)
        await commit(store, a.stream_id, base, base + 9)
    assert await store.truncate(a.stream_id, 15) == 15
    streams, chunks = await store.load()
    assert [(s.stream_id, s.start_offset, s.end_offset) for s in streams] == [
        (a.stream_id, 15, 30), (b.stream_id, 0, 30)]
    assert [(c.stream_id, c.base_offset) for c in chunks] == [
        (a.stream_id, 10), (a.stream_id, 20), (b.stream_id, 0), (b.stream_id, 10),
        (b.stream_id, 20)]


class Marks:
    """A CommitAttachment writing one row per live stream into a table of the layer above;
    `refuse` makes it a guard that refuses the commit."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse

    def apply(self, db: Connection, live: set[int]) -> None:
        if self.refuse:
            raise MetadataError("fenced")
        db.executemany("INSERT INTO marks VALUES (?, ?)", [(sid, 0) for sid in sorted(live)])

    def undo(self, db: Connection, undone: list[ChunkRow]) -> None:
        db.executemany("DELETE FROM marks WHERE stream_id=?", [(c.stream_id,) for c in undone])


async def test_attachments_commit_with_the_chunks_and_guards_refuse_them(
    store: MetadataStore,
) -> None:
    def marks() -> list[tuple[int, int]]:
        return sorted(tuple(r) for r in store.db.execute("SELECT * FROM marks"))

    await store._run(store.db.execute, "CREATE TABLE marks(stream_id BIGINT, base BIGINT)")
    a, b = await store.create_streams(2)
    await store.delete_streams([b.stream_id])
    oid = await store.reserve_object_ids(1)
    await store.commit_object(oid, "wal/x", 1, [chunk(a.stream_id, 0, 4, oid),
                                               chunk(b.stream_id, 0, 4, oid)], [Marks()])
    assert await store._run(marks) == [(a.stream_id, 0)]  # live streams only
    with pytest.raises(MetadataError, match="fenced"):  # a guard: nothing of the commit
        await commit(store, a.stream_id, 5, 9, [Marks(), Marks(refuse=True)])
    (live,), chunks = await store.load()
    assert live.end_offset == 5 and len(chunks) == 1
    assert await store._run(marks) == [(a.stream_id, 0)]
    # a commit whose COMMIT was in doubt, taken back: its attachments' rows go with it
    oid = await commit(store, a.stream_id, 5, 9, [Marks()])
    assert len(await store._run(marks)) == 2
    await store._run(store._undo_commits,
                     [ObjectCommit(oid, "wal/x", 1, [chunk(a.stream_id, 5, 9, oid)], [Marks()])])
    (live,), chunks = await store.load()
    assert live.end_offset == 5 and len(chunks) == 1 and await store._run(marks) == []


async def test_commit_objects_in_one_transaction_all_or_none(store: MetadataStore) -> None:
    """The WAL's group commit: objects in order, a stream's chunks following each other
    across them, each object's attachments seeing its own live streams; a conflict in any
    object commits none of them; taken back (COMMIT in doubt), the last object goes first."""

    def marks() -> list[tuple[int, int]]:
        return sorted(tuple(r) for r in store.db.execute("SELECT * FROM marks"))

    await store._run(store.db.execute, "CREATE TABLE marks(stream_id BIGINT, base BIGINT)")
    a, b = (s.stream_id for s in await store.create_streams(2))
    group = [ObjectCommit(1, "wal/1", 10, [chunk(a, 0, 4, 1)], [Marks()]),
             ObjectCommit(2, "wal/2", 10, [chunk(a, 5, 9, 2), chunk(b, 0, 2, 2)], [Marks()]),
             ObjectCommit(3, "wal/3", 10, [chunk(b, 3, 3, 3)])]
    assert await store.commit_objects(group) == [{a}, {a, b}, {b}]
    streams, chunks = await store.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 10, b: 4}
    assert [(c.stream_id, c.base_offset, c.object_id) for c in chunks] == [
        (a, 0, 1), (a, 5, 2), (b, 0, 2), (b, 3, 3)]
    assert await store._run(marks) == [(a, 0), (a, 0), (b, 0)]
    # the second object does not continue b: the first, fine alone, is not committed either
    with pytest.raises(OffsetConflictError):
        await store.commit_objects([ObjectCommit(4, "wal/4", 10, [chunk(a, 10, 11, 4)]),
                                    ObjectCommit(5, "wal/5", 10, [chunk(b, 5, 6, 5)])])
    # a guard of the last object refuses: none of them
    with pytest.raises(MetadataError, match="fenced"):
        await store.commit_objects([ObjectCommit(4, "wal/4", 10, [chunk(a, 10, 11, 4)]),
                                    ObjectCommit(5, "wal/5", 10, [chunk(b, 4, 6, 5)],
                                                 [Marks(refuse=True)])])
    streams, chunks = await store.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 10, b: 4}
    assert len(chunks) == 4 and not {4, 5} & set(await store.object_keys())
    # in doubt and taken back: a's two chunks go, each while it is a's last; marks too
    await store._run(store._undo_commits, group)
    streams, chunks = await store.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 0, b: 0}
    assert chunks == [] and await store._run(marks) == []


async def test_compaction_truncate_and_garbage(store: MetadataStore) -> None:
    (s,) = await store.create_streams(1)
    wal = [await commit(store, s.stream_id, base, base + 9) for base in (0, 10, 20)]
    assert [o.object_id for o in await store.objects("wal")] == wal
    old = await store.chunks_of_objects(wal[:2])
    assert [c.base_offset for c in old] == [0, 10]
    new_obj = ObjectRow(100, "stream/1/0-100", 500, "stream", 0)
    new = [ChunkRow(s.stream_id, 0, 19, 100, 24, 400, 0)]
    with pytest.raises(MetadataError):  # a chunk that is not there: nothing changes
        await store.replace_chunks([new_obj], new, [*old, chunk(s.stream_id, 99, 99, wal[0])])
    assert [o.object_id for o in await store.objects("stream")] == []
    await store.replace_chunks([new_obj], new, old)
    _, chunks = await store.load()
    assert [(c.base_offset, c.object_id) for c in chunks] == [(0, 100), (20, wal[2])]
    far_future = 2**62
    assert {o.object_id for o in await store.unreferenced_objects(far_future)} == set(wal[:2])
    assert await store.unreferenced_objects(0) == []  # none old enough

    assert await store.truncate(s.stream_id, 25) == 25
    assert await store.truncate(s.stream_id, 3) == 25  # never back
    streams, chunks = await store.load()
    assert streams[0].start_offset == 25 and [c.base_offset for c in chunks] == [20]
    garbage = {o.object_id for o in await store.unreferenced_objects(far_future)}
    assert garbage == {wal[0], wal[1], 100}
    await store.forget_objects([wal[0], wal[2], 100])  # wal[2] is still referenced: kept
    assert set(await store.object_keys()) == {wal[1], wal[2]}


def test_open_metadata_store_urls(tmp_path: Path) -> None:
    s = open_metadata_store(f"sqlite:///{tmp_path}/m.db")
    assert s.backend.describe() == f"sqlite:///{tmp_path}/m.db"
    with pytest.raises(ValueError) as e:
        open_metadata_store("mysql://root:hunter2@db/floe")
    assert "hunter2" not in str(e.value)
    pg = open_metadata_store("postgresql://floe:hunter2@db.example:5433/floe")
    assert pg.backend.describe() == "postgresql://floe:***@db.example:5433/floe"


async def test_a_stalled_writer_holding_a_lock_is_cut_off(pg_url: str) -> None:
    """A broker stopped (SIGSTOP, a long GC pause) in the middle of a metadata transaction
    keeps its connection open and its row locks held. Another broker's commit to the same
    stream must not wait on it forever: PostgreSQL ends a session idle in a transaction for
    longer than the store's bound, its locks go, and the stalled store learns on its next
    statement that its transaction is gone (it committed nothing)."""
    async with opened(pg_url) as a, opened(pg_url) as b:
        (s,) = await a.create_streams(1)
        stalled = a.backend.connect()
        try:
            stalled.execute("BEGIN")
            stalled.execute("SELECT end_offset FROM streams WHERE stream_id = ? FOR UPDATE",
                            (s.stream_id,))
            start = asyncio.get_running_loop().time()
            oid = await b.reserve_object_ids(1)
            await asyncio.wait_for(
                b.commit_object(oid, f"wal/{oid}", 1, [chunk(s.stream_id, 0, 4, oid)]), 30)
            waited = asyncio.get_running_loop().time() - start
            assert waited < IDLE_IN_TRANSACTION_S + 3, waited
            with pytest.raises(MetadataUnavailableError):
                stalled.execute("UPDATE streams SET end_offset = 99 WHERE stream_id = ?",
                                (s.stream_id,))
        finally:
            stalled.close()
        streams, _ = await a.load()
        assert streams[0].end_offset == 5


def test_postgres_sessions_bound_idle_transactions_unless_the_url_says() -> None:
    def options(url: str) -> str:
        backend = open_metadata_store(url).backend
        assert isinstance(backend, PostgresBackend)
        return str(conninfo_to_dict(backend.conninfo).get("options", ""))

    bound = f"-c idle_in_transaction_session_timeout={int(IDLE_IN_TRANSACTION_S * 1000)}"
    assert options("postgresql://u:p@h/db") == bound
    # the URL's own options are kept, the bound added to them
    assert options("postgresql://u:p@h/db?options=-c%20search_path%3Dfloe") == (
        f"-c search_path=floe {bound}")
    # a URL that sets the bound itself wins (0 turns it off)
    assert options("postgresql://u:p@h/db?options=-c%20idle_in_transaction_session_timeout%3D0"
                   ) == "-c idle_in_transaction_session_timeout=0"
