"""A metadata database made by main at 59112ef (before schema versions; tests/data/main-59112ef,
see its README) opens in today's broker and is migrated in place: every record, offset, topic
config, committed group offset and producer-state row is still there, version 1 is recorded as
found and migration 2 (an index) applied, a second start changes nothing, and new writes
work. A database whose schema version is newer than the code is refused at startup with a
clear error and left unchanged."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tests.brokerproc import running_broker

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "main-59112ef"
TIMEOUT_S = 20.0
TABLES = ["meta", "topics", "streams", "objects", "chunks", "producer_batches", "group_offsets"]

# What make_fixture.py wrote: (key, value, timestamp) per partition, in offset order.
EXPECTED = {
    ("plain", 0): [(f"k{i}".encode(), f"plain-{i}".encode(), 1700000000000 + i)
                   for i in (0, 2, 4)],
    ("plain", 1): [(f"k{i}".encode(), f"plain-{i}".encode(), 1700000000000 + i)
                   for i in (1, 3, 5)],
    ("idem", 0): [(b"ik", f"idem-{i}".encode(), 1700000001000 + i) for i in range(5)],
}
CONFIGS = {"plain": ("retention.ms", "604800000"), "idem": ("max.message.bytes", "100000")}
COMMITTED = {("plain", 0): 2, ("plain", 1): 3}


def copy_fixture(tmp_path: Path) -> Path:
    data = tmp_path / "floe-data"
    data.mkdir()
    shutil.copy(FIXTURE / "meta.db", data / "meta.db")
    shutil.copytree(FIXTURE / "objects", data / "objects")
    return data


def dump(db_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(db_path) as db:
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall()) for t in TABLES}


def versions(db_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as db:
        return sorted(db.execute("SELECT * FROM schema_version").fetchall())


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


def test_a_database_made_by_main_59112ef_opens_migrated_with_nothing_lost(
    tmp_path: Path,
) -> None:
    data = copy_fixture(tmp_path)
    db = data / "meta.db"
    before = dump(db)
    assert before["producer_batches"] and before["group_offsets"]  # the fixture has them
    with sqlite3.connect(db) as conn:  # made before versions existed
        assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name='schema_version'"
                                ).fetchall()

    with running_broker(data) as broker:
        for (topic, partition), records in EXPECTED.items():
            got = read_all(broker.bootstrap, topic, partition, len(records))
            assert got == [(i, *r) for i, r in enumerate(records)], (topic, partition)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for topic, (name, value) in CONFIGS.items():
            (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)],
                                               request_timeout=TIMEOUT_S).values()
            assert future.result(timeout=TIMEOUT_S)[name].value == value
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g1"})
        try:
            committed = c.committed([TopicPartition(t, p) for t, p in COMMITTED],
                                    timeout=TIMEOUT_S)
        finally:
            c.close()
        assert {(tp.topic, tp.partition): tp.offset for tp in committed} == COMMITTED
    assert "Traceback" not in broker.log()

    assert dump(db) == before  # nothing lost or changed (producer state included)
    recorded = versions(db)
    assert recorded[0] == ("s3stream.metadata", 1, 0)  # found in place, not re-applied
    assert len(recorded) == 2 and recorded[1][:2] == ("s3stream.metadata", 2)  # then migrated
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name='chunks_object'").fetchall()

    # a second start is a no-op for the schema; the upgraded database takes new writes
    with running_broker(data) as broker:
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        p.produce("idem", key=b"ik", value=b"after-upgrade", partition=0)
        assert p.flush(TIMEOUT_S) == 0
        got = read_all(broker.bootstrap, "idem", 0, 6)
        assert [(o, v) for o, _, v, _ in got][-1] == (5, b"after-upgrade")
    assert versions(db) == recorded
    assert dump(db)["group_offsets"] == before["group_offsets"]


def test_a_database_newer_than_the_broker_is_refused_at_startup_and_left_unchanged(
    tmp_path: Path,
) -> None:
    data = copy_fixture(tmp_path)
    db = data / "meta.db"
    with sqlite3.connect(db) as conn:  # as a future floe with a migration 3 would leave it
        conn.execute("CREATE TABLE schema_version(component TEXT NOT NULL, version INTEGER"
                     " NOT NULL, applied_at INTEGER NOT NULL, PRIMARY KEY(component, version))")
        conn.execute("INSERT INTO schema_version VALUES ('s3stream.metadata', 1, 0),"
                     " ('s3stream.metadata', 2, 1), ('s3stream.metadata', 3, 2)")
    before = (dump(db), versions(db))
    proc = subprocess.run(
        [sys.executable, "-m", "broker.cli", "broker", "--listen", "127.0.0.1:0",
         "--metrics", "127.0.0.1:0", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "listening on" not in out
    assert "SchemaTooNewError" in out and "schema version 3" in out, out
    assert "written by a newer floe; refusing to open it" in out, out
    assert "Traceback" not in out, out  # one clear line, not a stack
    assert (dump(db), versions(db)) == before
