"""Metadata databases made by older mains open in today's broker and are migrated in place,
nothing lost: tests/data/main-59112ef (before schema versions) and tests/data/main-c59fec4 (the
last schema whose s3stream tables held topics, partitions, producer state and group offsets;
see each README). Every record, offset, topic config, committed group offset, Schema Registry
subject and producer-state row is still there after the move into broker.metadata's tables;
the producer state still catches duplicates; a second start changes nothing; new writes work.
A database whose schema version is newer than the code is refused at startup with a clear
error and left unchanged."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from broker.errors import ErrorCode, KafkaError
from broker.protocol.recordcodec import decode_records
from broker.protocol.records import iter_headers
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import open_object_store
from tests.brokerproc import running_broker
from tests.rawclient import make_batch

DATA = Path(__file__).resolve().parents[1] / "data"
TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Fixture:
    name: str
    records: dict[tuple[str, int], list[tuple[bytes, bytes, int]]]  # (key, value, timestamp)
    configs: dict[str, tuple[str, str]]
    committed: dict[tuple[str, int], int]  # group g1
    idempotent: list[tuple[str, int, int]]  # (topic, partition, batches): producer 1000, epoch 0
    recorded: list[tuple[str, int]]  # the versions the database had recorded
    subject: str | None = None  # a Schema Registry subject with version 1, schema id 1


def _records(topic: str, n: int, parts: int, ts: int, key: str | None = None
             ) -> dict[tuple[str, int], list[tuple[bytes, bytes, int]]]:
    return {(topic, p): [((key or f"k{i}").encode(), f"{topic}-{i}".encode(), ts + i)
                         for i in range(n) if i % parts == p] for p in range(parts)}


FIXTURES = [
    Fixture("main-59112ef",
            {**_records("plain", 6, 2, 1700000000000),
             **_records("idem", 5, 1, 1700000001000, "ik")},
            {"plain": ("retention.ms", "604800000"), "idem": ("max.message.bytes", "100000")},
            {("plain", 0): 2, ("plain", 1): 3}, [("idem", 0, 5)], []),
    Fixture("main-c59fec4",
            {**_records("multi", 9, 3, 1700000000000),
             **_records("idem", 6, 2, 1700000001000, "ik")},
            {"multi": ("cleanup.policy", "compact,delete"),
             "idem": ("max.message.bytes", "100000")},
            {("multi", 0): 1, ("multi", 2): 3, ("idem", 1): 2}, [("idem", 0, 3), ("idem", 1, 3)],
            [("s3stream.metadata", 1), ("s3stream.metadata", 2), ("schema_registry", 1)],
            "multi-value"),
]


def copy_fixture(tmp_path: Path, fixture: Fixture) -> Path:
    data = tmp_path / "floe-data"
    data.mkdir()
    shutil.copy(DATA / fixture.name / "meta.db", data / "meta.db")
    shutil.copytree(DATA / fixture.name / "objects", data / "objects")
    return data


def rows(db_path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as db:
        return sorted(db.execute(sql).fetchall())


def old_state(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """What the old schema held, in the shape today's tables hold it."""
    return {
        "topics": rows(db, "SELECT * FROM topics"),
        "partitions": rows(db, "SELECT topic, partition, stream_id FROM streams WHERE deleted=0"),
        "streams": rows(db, "SELECT stream_id, start_offset, end_offset, epoch, deleted"
                            " FROM streams"),
        "objects": rows(db, "SELECT * FROM objects"),
        "chunks": rows(db, "SELECT * FROM chunks"),
        "producers": rows(db, "SELECT * FROM producer_batches"),
        "offsets": rows(db, "SELECT * FROM group_offsets"),
        "meta": rows(db, "SELECT * FROM meta WHERE key != 'next_producer_id'"),
        "producer_id": rows(db, "SELECT * FROM meta WHERE key = 'next_producer_id'"),
    }


def new_state(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {
        "topics": rows(db, "SELECT * FROM kafka_topics"),
        "partitions": rows(db, "SELECT topic, partition, stream_id FROM kafka_partitions"),
        "streams": rows(db, "SELECT stream_id, start_offset, end_offset, epoch, deleted"
                            " FROM streams"),
        "objects": rows(db, "SELECT * FROM objects"),
        "chunks": rows(db, "SELECT * FROM chunks"),
        "producers": rows(db, "SELECT * FROM kafka_producer_batches"),
        "offsets": rows(db, "SELECT * FROM kafka_group_offsets"),
        "meta": rows(db, "SELECT * FROM meta"),
        "producer_id": rows(db, "SELECT * FROM kafka_meta WHERE key = 'next_producer_id'"),
    }


def versions(db_path: Path) -> list[tuple[Any, ...]]:
    return rows(db_path, "SELECT * FROM schema_version")


def read_all(bootstrap: str, topic: str, partition: int, count: int) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        got: list[Any] = []
        for _ in range(int(TIMEOUT_S)):
            for m in c.consume(num_messages=count - len(got), timeout=1.0):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.key(), m.value(), m.timestamp()[1]))
            if len(got) >= count:
                break
        return got
    finally:
        c.close()


def registry_subject(address: str, subject: str) -> Any:
    with urllib.request.urlopen(f"http://{address}/subjects/{subject}/versions/1",
                                timeout=TIMEOUT_S) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_a_database_made_by_an_older_main_opens_migrated_with_nothing_lost(
    tmp_path: Path, fixture: Fixture,
) -> None:
    data = copy_fixture(tmp_path, fixture)
    db = data / "meta.db"
    before = old_state(db)
    assert before["producers"] and before["offsets"] and before["producer_id"]
    recorded_before = versions(db) if fixture.recorded else []
    assert [r[:2] for r in recorded_before] == fixture.recorded

    with running_broker(data, "--schema-registry", "127.0.0.1:0") as broker:
        for (topic, partition), records in fixture.records.items():
            got = read_all(broker.bootstrap, topic, partition, len(records))
            assert got == [(i, *r) for i, r in enumerate(records)], (topic, partition)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for topic, (name, value) in fixture.configs.items():
            (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)],
                                               request_timeout=TIMEOUT_S).values()
            assert future.result(timeout=TIMEOUT_S)[name].value == value
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g1"})
        try:
            committed = c.committed([TopicPartition(t, p) for t, p in fixture.committed],
                                    timeout=TIMEOUT_S)
        finally:
            c.close()
        assert {(tp.topic, tp.partition): tp.offset for tp in committed} == fixture.committed
        if fixture.subject is not None:
            deadline = time.monotonic() + TIMEOUT_S
            while not broker.registry and time.monotonic() < deadline:
                time.sleep(0.05)
            got = registry_subject(broker.registry, fixture.subject)
            assert (got["subject"], got["version"], got["id"]) == (fixture.subject, 1, 1)
    assert "Traceback" not in broker.log()

    after = new_state(db)
    # the registry, off in 59112ef's broker, adds its rows to meta; nothing else is added
    added = set(after.pop("meta")) - set(before["meta"])
    assert set(before.pop("meta")) <= set(rows(db, "SELECT * FROM meta"))
    assert all(key.startswith("schema_registry.") for key, _ in added), added
    assert after == before  # every row moved, nothing lost or changed
    for table in ["topics", "producer_batches", "group_offsets", "legacy_stream_partitions"]:
        assert not rows(db, f"SELECT name FROM sqlite_master WHERE name='{table}'"), table
    recorded = versions(db)
    assert [r for r in recorded if r[:2] in fixture.recorded] == recorded_before
    assert {r[:2] for r in recorded} == {*fixture.recorded, ("s3stream.metadata", 1),
                                         ("s3stream.metadata", 2), ("s3stream.metadata", 3),
                                         ("broker.table_states", 1), ("broker.table_work", 1),
                                         ("broker.metadata", 1), ("broker.metadata", 2),
                                         ("broker.metadata", 3), ("broker.metadata", 4),
                                         ("broker.metadata", 5), ("broker.metadata", 6),
                                         ("schema_registry", 1)}

    # a second start is a no-op for the schema; the upgraded database takes new writes
    topic, partition, batches = fixture.idempotent[0]
    with running_broker(data) as broker:
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        p.produce(topic, key=b"ik", value=b"after-upgrade", partition=partition)
        assert p.flush(TIMEOUT_S) == 0
        got = read_all(broker.bootstrap, topic, partition, batches + 1)
        assert [(o, v) for o, _, v, _ in got][-1] == (batches, b"after-upgrade")
    assert versions(db) == recorded
    assert new_state(db)["offsets"] == before["offsets"]


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
async def test_producer_state_from_an_older_main_still_catches_duplicates(
    tmp_path: Path, fixture: Fixture,
) -> None:
    """Producer 1000 (epoch 0) wrote one single-record batch per sequence: a retry of one of
    its last batches is answered with the original offset and not stored again, a sequence
    gap is refused, the next sequence is appended; all from the migrated rows."""
    data = copy_fixture(tmp_path, fixture)
    s = Storage(open_object_store(f"file://{data / 'objects'}"),
                SqliteMetadataStore(data / "meta.db"), WalSettings(flush_interval_ms=1))
    await s.open()
    try:
        for topic, partition, batches in fixture.idempotent:
            last = batches - 1

            def batch(seq: int, topic: str = topic) -> bytes:
                return bytes(make_batch([f"{topic}-retry".encode()], producer_id=1000,
                                        producer_epoch=0, base_sequence=seq))

            for seq in (last, last - 1):  # retries of durable batches
                assert (await s.append(topic, partition, batch(seq))).base_offset == seq
            assert s.offsets(topic, partition) == (0, batches)
            with pytest.raises(KafkaError) as e:
                s.append(topic, partition, batch(batches + 3))
            assert e.value.code == ErrorCode.out_of_order_sequence_number
            assert (await s.append(topic, partition, batch(batches))).base_offset == batches
            log = await s.read(topic, partition, 0, 1 << 20, True)
            stored = [r for h in iter_headers(log) for r in decode_records(log, h)]
            assert [r.value for r in stored][-1] == f"{topic}-retry".encode()
            assert len(stored) == batches + 1
    finally:
        await s.close()


def test_a_database_newer_than_the_broker_is_refused_at_startup_and_left_unchanged(
    tmp_path: Path,
) -> None:
    data = copy_fixture(tmp_path, FIXTURES[1])
    db = data / "meta.db"
    with sqlite3.connect(db) as conn:  # as a future floe with a migration 4 would leave it
        conn.execute("INSERT INTO schema_version VALUES ('s3stream.metadata', 3, 2),"
                     " ('s3stream.metadata', 4, 3)")
    before = (old_state(db), versions(db))
    proc = subprocess.run(
        [sys.executable, "-m", "broker.cli", "broker", "--listen", "127.0.0.1:0",
         "--metrics", "127.0.0.1:0", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "listening on" not in out
    assert "SchemaTooNewError" in out and "schema version 4" in out, out
    assert "written by a newer floe; refusing to open it" in out, out
    assert "Traceback" not in out, out  # one clear line, not a stack
    assert (old_state(db), versions(db)) == before
