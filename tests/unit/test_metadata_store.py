"""The metadata store's behaviour, the same on every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from s3stream.metadata import (
    PRODUCER_BATCHES_KEPT,
    ChunkRow,
    MetadataError,
    MetadataStore,
    ObjectRow,
    OffsetConflictError,
    OffsetRow,
    ProducerBatchRow,
    open_metadata_store,
)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return str(request.getfixturevalue("pg_url"))


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[MetadataStore]:
    store = open_metadata_store(url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def store(url: str) -> AsyncIterator[MetadataStore]:
    async with opened(url) as s:
        yield s


def chunk(sid: int, base: int, last: int, oid: int, ts: int = 0) -> ChunkRow:
    return ChunkRow(sid, base, last, oid, 24, 10 * (last - base + 1), ts)


async def commit(store: MetadataStore, sid: int, base: int, last: int,
                 producers: list[ProducerBatchRow] | None = None) -> int:
    oid = await store.reserve_object_ids(1)
    await store.commit_object(oid, f"wal/{oid}", 100, [chunk(sid, base, last, oid)], producers)
    return oid


async def test_topics_create_add_partitions_configs_delete(store: MetadataStore) -> None:
    topic, streams = await store.create_topic("orders", 3, {"retention.ms": "1000"})
    assert topic.name == "orders" and topic.configs == {"retention.ms": "1000"}
    assert [(s.topic, s.partition, s.start_offset, s.end_offset) for s in streams] == [
        ("orders", p, 0, 0) for p in range(3)]
    assert len({s.stream_id for s in streams}) == 3
    with pytest.raises(MetadataError):
        await store.create_topic("orders", 1, {})
    more = await store.add_partitions("orders", 3, 2)
    assert [s.partition for s in more] == [3, 4]
    await store.set_topic_configs("orders", {"cleanup.policy": "compact"})
    await store.create_topic("other", 1, {})
    topics, live, _ = await store.load()
    assert {t.name: (t.topic_id, t.configs) for t in topics}["orders"] == (
        topic.topic_id, {"cleanup.policy": "compact"})
    assert sorted(s.partition for s in live if s.topic == "orders") == [0, 1, 2, 3, 4]

    await commit(store, streams[0].stream_id, 0, 4, [ProducerBatchRow(
        streams[0].stream_id, 7, 0, 0, 4, 0, 4)])
    await store.delete_topic("orders")
    topics, live, chunks = await store.load()
    assert [t.name for t in topics] == ["other"]
    assert {s.topic for s in live} == {"other"} and chunks == []
    assert await store.load_producers() == []
    # the name is free again, with new streams starting at offset 0
    _, again = await store.create_topic("orders", 1, {})
    assert again[0].stream_id not in {s.stream_id for s in streams + more}
    assert again[0].end_offset == 0


async def test_cluster_id_and_counters_survive_reopen(url: str) -> None:
    async with opened(url) as s:
        cid = await s.cluster_id()
        first = await s.reserve_object_ids(64)
        second = await s.reserve_object_ids(10)
        assert first == 1 and second == 65
        assert await s.next_producer_id() == 1000
        assert await s.next_producer_id() == 1001
    async with opened(url) as s:
        assert await s.cluster_id() == cid and len(cid) == 22
        assert await s.reserve_object_ids(1) == 75
        assert await s.next_producer_id() == 1002


async def test_object_ids_from_concurrent_stores_never_overlap(url: str) -> None:
    async with opened(url) as a, opened(url) as b:
        firsts = await asyncio.gather(*(s.reserve_object_ids(8) for s in [a, b] * 10))
    ranges = sorted(firsts)
    assert all(y - x >= 8 for x, y in itertools.pairwise(ranges))


async def test_commit_object_guard(store: MetadataStore) -> None:
    _, (s0, s1) = await store.create_topic("t", 2, {})
    await commit(store, s0.stream_id, 0, 9)
    with pytest.raises(OffsetConflictError):  # the same offset again
        await commit(store, s0.stream_id, 0, 9)
    with pytest.raises(OffsetConflictError):  # a gap
        await commit(store, s0.stream_id, 11, 12)
    # one stream's conflict fails the whole object: nothing of it is committed
    with pytest.raises(OffsetConflictError):
        await store.commit_object(50, "wal/50", 100, [chunk(s1.stream_id, 0, 4, 50),
                                                      chunk(s0.stream_id, 5, 9, 50)])
    _, streams, chunks = await store.load()
    assert {s.stream_id: s.end_offset for s in streams} == {s0.stream_id: 10, s1.stream_id: 0}
    assert [(c.stream_id, c.base_offset, c.last_offset) for c in chunks] == [
        (s0.stream_id, 0, 9)]
    assert 50 not in await store.object_keys()
    # a deleted stream's chunk is dropped, the others commit
    _, (gone,) = await store.create_topic("gone", 1, {})
    await store.delete_topic("gone")
    live = await store.commit_object(60, "wal/60", 100, [chunk(s0.stream_id, 10, 19, 60),
                                                         chunk(gone.stream_id, 0, 3, 60)])
    assert live == {s0.stream_id}
    assert (await store.object_keys())[60] == "wal/60"


async def test_racing_commits_to_one_stream_exactly_one_wins(url: str) -> None:
    async with opened(url) as a, opened(url) as b:
        _, (s,) = await a.create_topic("race", 1, {})
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
        _, streams, chunks = await a.load()
    assert streams[0].end_offset == end
    assert [c.base_offset for c in chunks] == [0] + [c.last_offset + 1 for c in chunks[:-1]]


async def test_many_writers_keep_a_dense_log(url: str) -> None:
    """Writers that reload the end offset after each conflict, as a failed-over broker
    would: every offset is committed exactly once."""
    async with opened(url) as setup:
        _, (s,) = await setup.create_topic("busy", 1, {})

    async def writer(n: int) -> int:
        async with opened(url) as store:
            done = 0
            while done < 8:
                _, streams, _ = await store.load()
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
    async with opened(url) as check:
        _, streams, chunks = await check.load()
    assert len(chunks) == 32
    assert [c.base_offset for c in chunks] == [0] + [c.last_offset + 1 for c in chunks[:-1]]
    assert streams[0].end_offset == chunks[-1].last_offset + 1


async def test_a_commit_waiting_for_another_writers_lock_sees_its_end_offset(
    store: MetadataStore,
) -> None:
    """The guard is read under the lock: a commit that had to wait does not act on the end
    offset from before the other writer's COMMIT."""
    _, (s,) = await store.create_topic("t", 1, {})
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
    _, streams, chunks = await store.load()
    assert streams[0].end_offset == 5 and chunks == []


async def test_load_returns_chunks_in_order_from_the_start_offset(store: MetadataStore) -> None:
    _, (a, b) = await store.create_topic("t", 2, {})
    for base in range(0, 30, 10):
        await commit(store, b.stream_id, base, base + 9)
        await commit(store, a.stream_id, base, base + 9)
    assert await store.truncate(a.stream_id, 15) == 15
    _, streams, chunks = await store.load()
    assert [(s.stream_id, s.start_offset, s.end_offset) for s in streams] == [
        (a.stream_id, 15, 30), (b.stream_id, 0, 30)]
    assert [(c.stream_id, c.base_offset) for c in chunks] == [
        (a.stream_id, 10), (a.stream_id, 20), (b.stream_id, 0), (b.stream_id, 10),
        (b.stream_id, 20)]


async def test_producer_batches_keep_the_last_five(store: MetadataStore) -> None:
    _, (s, t) = await store.create_topic("t", 2, {})
    for i in range(8):
        await commit(store, s.stream_id, 2 * i, 2 * i + 1, [
            ProducerBatchRow(s.stream_id, 42, 0, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1)])
    await commit(store, t.stream_id, 0, 0, [ProducerBatchRow(t.stream_id, 42, 0, 0, 0, 0, 0)])
    await commit(store, s.stream_id, 16, 16, [ProducerBatchRow(s.stream_id, 43, 1, 0, 0, 16, 16)])
    rows = await store.load_producers()
    mine = [r for r in rows if r.stream_id == s.stream_id and r.producer_id == 42]
    assert len(mine) == PRODUCER_BATCHES_KEPT
    assert [r.base_offset for r in mine] == [6, 8, 10, 12, 14]
    assert [r.first_seq for r in mine] == [6, 8, 10, 12, 14]
    assert [(r.stream_id, r.producer_id) for r in rows if r not in mine] == [
        (s.stream_id, 43), (t.stream_id, 42)]


async def test_group_offsets(store: MetadataStore) -> None:
    def row(group: str, topic: str, p: int, off: int, meta: str | None = None) -> OffsetRow:
        return OffsetRow(group, topic, p, off, 3, meta, 1_700_000_000_000 + off)

    await store.commit_offsets([row("g", "a", 0, 5), row("g", "a", 1, 7, "m"),
                                row("h", "a", 0, 1), row("h", "b", 0, 2)])
    await store.commit_offsets([row("g", "a", 0, 9, "again")])  # an upsert
    got = {(r.group_id, r.topic, r.partition): r for r in await store.load_offsets()}
    assert got[("g", "a", 0)] == row("g", "a", 0, 9, "again")
    assert got[("g", "a", 1)].metadata == "m" and len(got) == 4
    await store.delete_offsets("g", [("a", 1)])
    await store.delete_topic_offsets("b")
    assert sorted((r.group_id, r.topic, r.partition) for r in await store.load_offsets()) == [
        ("g", "a", 0), ("h", "a", 0)]
    await store.delete_offsets("h", None)
    assert [r.group_id for r in await store.load_offsets()] == ["g"]


async def test_compaction_truncate_and_garbage(store: MetadataStore) -> None:
    _, (s,) = await store.create_topic("t", 1, {})
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
    _, _, chunks = await store.load()
    assert [(c.base_offset, c.object_id) for c in chunks] == [(0, 100), (20, wal[2])]
    far_future = 2**62
    assert {o.object_id for o in await store.unreferenced_objects(far_future)} == set(wal[:2])
    assert await store.unreferenced_objects(0) == []  # none old enough

    assert await store.truncate(s.stream_id, 25) == 25
    assert await store.truncate(s.stream_id, 3) == 25  # never back
    _, streams, chunks = await store.load()
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
