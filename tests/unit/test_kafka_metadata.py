"""The broker's Kafka metadata (broker.metadata) on the s3stream store's plumbing, the same on
SQLite and PostgreSQL: topics, partitions -> streams, configs, atomic topic deletion, producer
rows written inside the WAL commit (and taken back with it), group offsets, producer ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from broker.metadata import (
    PRODUCER_BATCHES_KEPT,
    KafkaMetadata,
    OffsetRow,
    ProducerBatchRow,
    ProducerRows,
)
from s3stream.metadata import ChunkRow, CommitInDoubtError, MetadataError, open_metadata_store
from tests.unit.test_metadata_postgres import LoseCommit


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return str(request.getfixturevalue("pg_url"))


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[KafkaMetadata]:
    k = KafkaMetadata(open_metadata_store(url))
    await k.open()
    try:
        yield k
    finally:
        await k.close()


@pytest.fixture
async def kafka(url: str) -> AsyncIterator[KafkaMetadata]:
    async with opened(url) as k:
        yield k


async def commit(k: KafkaMetadata, sid: int, base: int, last: int,
                 producers: list[ProducerBatchRow] | None = None) -> int:
    oid = await k.store.reserve_object_ids(1)
    chunk = ChunkRow(sid, base, last, oid, 24, 10 * (last - base + 1), 0)
    await k.store.commit_object(oid, f"wal/{oid}", 100, [chunk],
                                [ProducerRows(producers)] if producers else [])
    return oid


async def test_topics_create_add_partitions_configs_delete(kafka: KafkaMetadata) -> None:
    topic, streams = await kafka.create_topic("orders", 3, {"retention.ms": "1000"})
    assert topic.name == "orders" and topic.configs == {"retention.ms": "1000"}
    assert [(s.start_offset, s.end_offset) for s in streams] == [(0, 0)] * 3
    assert len({s.stream_id for s in streams}) == 3
    with pytest.raises(MetadataError):
        await kafka.create_topic("orders", 1, {})
    more = await kafka.add_partitions("orders", 3, 2)
    await kafka.set_topic_configs("orders", {"cleanup.policy": "compact"})
    await kafka.create_topic("other", 1, {})
    state = await kafka.load()
    assert {t.name: (t.topic_id, t.configs) for t in state.topics}["orders"] == (
        topic.topic_id, {"cleanup.policy": "compact"})
    assert [(p.partition, p.stream_id) for p in state.partitions if p.topic == "orders"] == [
        (i, s.stream_id) for i, s in enumerate(streams + more)]
    assert len(state.streams) == 6

    await commit(kafka, streams[0].stream_id, 0, 4, [ProducerBatchRow(
        streams[0].stream_id, 7, 0, 0, 4, 0, 4)])
    assert len((await kafka.load()).producers) == 1
    await kafka.delete_topic("orders")  # streams, chunks and producer rows in one transaction
    state = await kafka.load()
    assert [t.name for t in state.topics] == ["other"]
    assert [p.topic for p in state.partitions] == ["other"]
    assert len(state.streams) == 1 and state.chunks == [] and state.producers == []
    left = await kafka.store._run(lambda: kafka.store.db.execute(
        "SELECT count(*) FROM kafka_producer_batches").fetchone()[0])
    assert left == 0
    # the name is free again, with new streams starting at offset 0
    _, again = await kafka.create_topic("orders", 1, {})
    assert again[0].stream_id not in {s.stream_id for s in streams + more}
    assert again[0].end_offset == 0


async def test_producer_ids_survive_reopen_and_never_repeat(url: str) -> None:
    async with opened(url) as a:
        assert await a.next_producer_id() == 1000
        assert await a.next_producer_id() == 1001
    async with opened(url) as a, opened(url) as b:
        ids = await asyncio.gather(*(k.next_producer_id() for k in [a, b] * 5))
    assert sorted(ids) == list(range(1002, 1012))


async def test_producer_batches_keep_the_last_five(kafka: KafkaMetadata) -> None:
    _, (s, t) = await kafka.create_topic("t", 2, {})
    for i in range(8):
        await commit(kafka, s.stream_id, 2 * i, 2 * i + 1, [
            ProducerBatchRow(s.stream_id, 42, 0, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1)])
    await commit(kafka, t.stream_id, 0, 0, [ProducerBatchRow(t.stream_id, 42, 0, 0, 0, 0, 0)])
    await commit(kafka, s.stream_id, 16, 16, [ProducerBatchRow(s.stream_id, 43, 1, 0, 0, 16, 16)])
    rows = (await kafka.load()).producers
    mine = [r for r in rows if r.stream_id == s.stream_id and r.producer_id == 42]
    assert len(mine) == PRODUCER_BATCHES_KEPT
    assert [r.base_offset for r in mine] == [6, 8, 10, 12, 14]
    assert [r.first_seq for r in mine] == [6, 8, 10, 12, 14]
    assert [(r.stream_id, r.producer_id) for r in rows if r not in mine] == [
        (s.stream_id, 43), (t.stream_id, 42)]


async def test_producer_rows_are_not_written_when_the_commit_is_refused(
    kafka: KafkaMetadata,
) -> None:
    _, (s,) = await kafka.create_topic("t", 1, {})
    await commit(kafka, s.stream_id, 0, 0)
    with pytest.raises(MetadataError):  # offset conflict: neither chunk nor producer row
        await commit(kafka, s.stream_id, 5, 5, [ProducerBatchRow(s.stream_id, 1, 0, 0, 0, 5, 5)])
    assert (await kafka.load()).producers == []


@pytest.mark.parametrize("committed", [True, False])
async def test_producer_rows_of_a_commit_in_doubt_are_taken_back(
    pg_url: str, committed: bool
) -> None:
    async with opened(pg_url) as kafka:
        _, (s,) = await kafka.create_topic("t", 1, {})
        await commit(kafka, s.stream_id, 0, 0, [ProducerBatchRow(s.stream_id, 9, 0, 0, 0, 0, 0)])
        oid = await kafka.store.reserve_object_ids(1)
        kafka.store._db = LoseCommit(kafka.store.db, committed)
        with pytest.raises(CommitInDoubtError):
            await kafka.store.commit_object(
                oid, "wal/x", 1, [ChunkRow(s.stream_id, 1, 1, oid, 0, 1, 0)],
                [ProducerRows([ProducerBatchRow(s.stream_id, 9, 0, 1, 1, 1, 1)])])
        state = await kafka.load()  # the next call undid it, had it committed
        assert [x.end_offset for x in state.streams] == [1]
        assert [(r.first_seq, r.base_offset) for r in state.producers] == [(0, 0)]


async def test_group_offsets(kafka: KafkaMetadata) -> None:
    def row(group: str, topic: str, p: int, off: int, meta: str | None = None) -> OffsetRow:
        return OffsetRow(group, topic, p, off, 3, meta, 1_700_000_000_000 + off)

    await kafka.commit_offsets([row("g", "a", 0, 5), row("g", "a", 1, 7, "m"),
                                row("h", "a", 0, 1), row("h", "b", 0, 2)])
    await kafka.commit_offsets([row("g", "a", 0, 9, "again")])  # an upsert
    got = {(r.group_id, r.topic, r.partition): r for r in await kafka.load_offsets()}
    assert got[("g", "a", 0)] == row("g", "a", 0, 9, "again")
    assert got[("g", "a", 1)].metadata == "m" and len(got) == 4
    await kafka.delete_offsets("g", [("a", 1)])
    await kafka.delete_topic_offsets("b")
    assert sorted((r.group_id, r.topic, r.partition) for r in await kafka.load_offsets()) == [
        ("g", "a", 0), ("h", "a", 0)]
    await kafka.delete_offsets("h", None)
    assert [r.group_id for r in await kafka.load_offsets()] == ["g"]
