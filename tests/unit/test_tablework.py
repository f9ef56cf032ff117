"""The table-work rows (broker.metadata.tablework) on SQLite and PostgreSQL: only the leader of
partition 0 at its epoch makes commit requests and publishes progress; a worker's file sets
are taken only for partitions it leads at the epoch it names (a deposed leader's are refused);
workers learn what landed; a deleted topic's rows go."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.metadata import KafkaMetadata
from broker.metadata.tablework import Answer, FileSet, TableWork
from s3stream.metadata import MetadataStore, open_metadata_store

TOPIC = "t"


@pytest.fixture(params=["sqlite", "postgresql"])
def meta_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def store(meta_url: str) -> AsyncIterator[MetadataStore]:
    store = open_metadata_store(meta_url)
    kafka = KafkaMetadata(store)
    await kafka.open()  # kafka_partitions, with leaders and epochs
    await kafka.create_topic(TOPIC, 2, {})
    yield store
    await store.close()


def lead(store: MetadataStore, partition: int, node: int, epoch: int) -> None:
    with store._txn() as db:
        db.execute("UPDATE kafka_partitions SET leader=?, leader_epoch=? WHERE topic=? AND"
                   " partition=?", (node, epoch, TOPIC, partition))


def files(partition: int, start: int, nxt: int, epoch: int) -> FileSet:
    return FileSet(TOPIC, partition, start, epoch, nxt, 1, 0, '{"format":1,"files":[]}',
                   nxt - start, 0, 0)


async def test_requests_answers_settle_fate_forget(store: MetadataStore) -> None:
    work = TableWork(store)
    await work.open()
    await store._run(lead, store, 0, 1, 5)
    await store._run(lead, store, 1, 2, 3)
    assert await work.request(TOPIC, 2, 3) is None  # broker 2 does not lead partition 0
    assert await work.request(TOPIC, 1, 4) is None  # broker 1, but not at that epoch
    assert await work.request(TOPIC, 1, 5) == 1
    assert await work.request(TOPIC, 1, 5) == 2
    assert await work.requests() == {TOPIC: 2}

    # broker 2 answers for partition 1 (led at epoch 3) and, wrongly, partition 0: refused
    taken = await work.answer(TOPIC, 2, 2, [
        Answer(1, 3, files(1, 0, 10, 3), 0, 0), Answer(0, 5, files(0, 0, 7, 5), 0, 0)])
    assert taken == {1}
    # a deposed leader of partition 1 (epoch 2) is refused too
    assert await work.answer(TOPIC, 2, 2, [Answer(1, 2, files(1, 10, 20, 2), 0, 0)]) == set()
    taken = await work.answer(TOPIC, 1, 2, [Answer(0, 5, None, 4, 400)])
    assert taken == {0}
    out = await work.outstanding(TOPIC)
    assert [(f.partition, f.start, f.next, f.leader_epoch) for f in out.files] == [(1, 0, 10, 3)]
    assert out.leaders == {0: (1, 5), 1: (2, 3)}
    assert {p: (w.node_id, w.answered, w.pending_records) for p, w in out.workers.items()} == {
        0: (1, 2, 4), 1: (2, 2, 0)}
    assert out.progress is None

    # the worker: still waiting, then gone with the table past it (landed)
    waiting, progress = await work.fate(TOPIC, [(1, 0, 3)])
    assert waiting == {(1, 0, 3)} and progress is None
    assert not await work.settle(TOPIC, "default.t", {1: 10}, 77, [(1, 0, 3)], 2, 3)  # not p0's
    assert await work.settle(TOPIC, "default.t", {1: 10}, 77, [(1, 0, 3)], 1, 5)
    waiting, progress = await work.fate(TOPIC, [(1, 0, 3)])
    assert waiting == set() and progress is not None and progress.offsets == {1: 10}
    assert progress.snapshot_id == 77 and progress.table == "default.t"
    assert [p.topic for p in await work.progress()] == [TOPIC]

    await work.forget(TOPIC)
    assert await work.requests() == {}
    assert await work.progress() == []
    assert await work.workers() == []
