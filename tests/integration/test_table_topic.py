"""Table topics end to end: a real producer, the broker writing Iceberg, pyiceberg reading.

What must hold in every test: the set of (_kafka.partition, _kafka.offset) in the table plus
the dead letters equals the topic's offsets, with no duplicate."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.catalog.sql import SqlCatalog

from tests.brokerproc import BrokerProcess
from tests.kafkaread import consume_all

pytestmark = pytest.mark.integration


def catalog(data_dir: Path) -> SqlCatalog:
    return SqlCatalog("floe", uri=f"sqlite:///{data_dir / 'catalog.db'}",
                      warehouse=(data_dir / "warehouse").as_uri())


def table_rows(data_dir: Path, name: str) -> list[dict[str, Any]]:
    try:
        t = catalog(data_dir).load_table(("default", name))
    except Exception:
        return []
    rows: list[dict[str, Any]] = t.scan().to_arrow().to_pylist()
    return rows


def start(tmp_path: Path, *extra: str) -> BrokerProcess:
    return BrokerProcess(data_dir=tmp_path / "data",
                         extra_args=["--metrics", "127.0.0.1:0", *extra]).start()


def create_table_topic(bootstrap: str, name: str, partitions: int, **cfg: str) -> None:
    config = {"table.topic.enable": "true", "table.topic.convert.value.type": "json",
              "table.topic.commit.interval.ms": "1000", **cfg}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(10)


def produce_json(bootstrap: str, topic: str, docs: list[bytes], partitions: int) -> dict[
    tuple[int, int], bytes
]:
    acked: dict[tuple[int, int], bytes] = {}
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i, d in enumerate(docs):
        p.produce(topic, d, key=str(i).encode(), partition=i % partitions,
                  on_delivery=lambda e, m: acked.__setitem__(
                      (m.partition(), m.offset()), m.value()) if e is None else None)
        if i % 2000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    return acked


def wait_rows(data_dir: Path, name: str, want: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = table_rows(data_dir, name)
        if len(rows) >= want:
            return rows
        time.sleep(0.25)
    return rows


def keys_of(rows: list[dict[str, Any]]) -> Counter[tuple[int, int]]:
    return Counter((r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in rows)


def doc(i: int) -> bytes:
    return json.dumps({"id": i, "name": f"user-{i}", "score": i / 4,
                       "tags": ["a", str(i % 7)], "address": {"zip": f"{i % 1000:05d}"}}).encode()


def test_fifty_thousand_json_records_land_exactly_once(tmp_path: Path) -> None:
    broker = start(tmp_path)
    try:
        create_table_topic(broker.bootstrap, "clicks.v1", 3,
                           **{"table.topic.commit.interval.ms": "2000"})
        acked = produce_json(broker.bootstrap, "clicks.v1", [doc(i) for i in range(50_000)], 3)
        last_ack = time.monotonic()
        rows = wait_rows(tmp_path / "data", "clicks_v1", 50_000, 2 + 5)
        visible_after = time.monotonic() - last_ack
        keys = keys_of(rows)
        assert set(keys) == set(acked), f"table has {len(keys)} of {len(acked)} offsets " \
            f"{visible_after:.1f}s after the last ack"
        assert max(keys.values()) == 1, "a record is in the table twice"
        by_key = {(r["_kafka"]["partition"], r["_kafka"]["offset"]): r for r in rows}
        for k, v in list(acked.items())[:2000]:
            want = json.loads(v)
            got = by_key[k]
            assert {f: got[f] for f in ("id", "name", "score", "tags")} == {
                f: want[f] for f in ("id", "name", "score", "tags")}
            assert got["address"] == want["address"]
            assert got["_kafka"]["key"] == str(want["id"]).encode()
        metrics = broker.log().split("metrics on ", 1)[1].split()[0]
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
        table = (("table", "default.clicks_v1"), ("topic", "clicks.v1"))
        for p in range(3):
            assert got[("floe_table_lag_records", (("partition", str(p)), *table))] == 0
        assert got[("floe_table_commits_total", table)] >= 1
    finally:
        broker.stop()


def arrow_loaded(broker: BrokerProcess) -> bool:
    """Whether the broker process has mapped Arrow's library (pyarrow imported)."""
    assert broker.proc is not None
    return "libarrow" in Path(f"/proc/{broker.proc.pid}/maps").read_text()


def test_arrow_is_loaded_with_the_first_table_topic_only(tmp_path: Path) -> None:
    """A broker without table topics serves plain topics without pyarrow (its ~60 MiB);
    the first table topic loads it, and its writer works: every acked record is a row."""
    broker = start(tmp_path)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("plain", 1, 1)])["plain"].result(10)
        produce_json(broker.bootstrap, "plain", [doc(i) for i in range(100)], 1)
        assert len(consume_all(broker.bootstrap, "plain", 1)) == 100
        metrics = broker.log().split("metrics on ", 1)[1].split()[0]
        pages = [f"{broker.admin_address()}/status", f"{broker.admin_address()}/",
                 f"{metrics}/metrics"]  # each lists table topics (none)
        for page in pages:
            with urllib.request.urlopen(f"http://{page}", timeout=10):
                pass
        assert not arrow_loaded(broker), "pyarrow was loaded without a table topic"
        create_table_topic(broker.bootstrap, "later", 1)
        acked = produce_json(broker.bootstrap, "later", [doc(i) for i in range(100)], 1)
        rows = wait_rows(tmp_path / "data", "later", 100, 30)
        assert set(keys_of(rows)) == set(acked)
        assert arrow_loaded(broker)
    finally:
        broker.stop()


def test_sigkill_mid_stream_still_exactly_once(tmp_path: Path) -> None:
    broker = start(tmp_path)
    try:
        create_table_topic(broker.bootstrap, "orders", 3,
                           **{"table.topic.commit.interval.ms": "300"})
        acked = produce_json(broker.bootstrap, "orders", [doc(i) for i in range(6000)], 3)
        wait_rows(tmp_path / "data", "orders", 1, 15)  # some commits happened
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2})
        for i in range(6000, 9000):
            p.produce("orders", doc(i), partition=i % 3)
        p.poll(0)
        broker.kill()  # mid-stream, maybe mid-commit
        p.flush(5)
        broker.start()
        acked.update(produce_json(broker.bootstrap, "orders",
                                  [doc(i) for i in range(9000, 12_000)], 3))
        topic = consume_all(broker.bootstrap, "orders", 3)
        rows = wait_rows(tmp_path / "data", "orders", len(topic), 20)
        keys = keys_of(rows)
        assert max(keys.values()) == 1, "duplicates after the crash"
        assert set(keys) == set(topic)
        assert set(acked) <= set(keys)
    finally:
        broker.stop()


def test_invalid_records_go_to_the_dead_letter_topic(tmp_path: Path) -> None:
    broker = start(tmp_path)
    try:
        create_table_topic(broker.bootstrap, "events", 2)
        docs = []
        for i in range(3000):
            if i % 100 == 7:
                docs.append(b"{not json")
            elif i % 100 == 42:
                docs.append(json.dumps({"id": "not-a-number"}).encode())  # type conflict
            elif i % 100 == 77:
                docs.append(b"[1, 2, 3]")  # not an object
            else:
                docs.append(doc(i))
        # the first record fixes the column types
        acked = produce_json(broker.bootstrap, "events", docs, 2)
        bad = {(i % 2, i // 2) for i in range(3000) if i % 100 in (7, 42, 77)}
        assert len(bad) == 90
        rows = wait_rows(tmp_path / "data", "events", 3000 - 90, 20)
        dead = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(dead) < 90:
            with contextlib.suppress(AssertionError):
                dead = consume_all(broker.bootstrap, "events.dlq", 1)
            time.sleep(0.5)
        keys = keys_of(rows)
        assert max(keys.values()) == 1
        assert len(dead) == 90
        assert len(keys) + len(dead) == len(acked) == 3000
        assert not set(keys) & bad
        assert sorted(dead.values()) == sorted(acked[k] for k in bad)
    finally:
        broker.stop()


def test_enable_later_backfills_and_alias_keys_work(tmp_path: Path) -> None:
    broker = start(tmp_path)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("legacy", 2, 1)])["legacy"].result(10)
        acked = produce_json(broker.bootstrap, "legacy", [doc(i) for i in range(500)], 2)
        res = ConfigResource("topic", "legacy", incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in {
                "automq.table.topic.enable": "true",
                "automq.table.topic.convert.value.type": "raw",
                "automq.table.topic.commit.interval.ms": "500"}.items()])
        for f in admin.incremental_alter_configs([res]).values():
            f.result(10)
        rows = wait_rows(tmp_path / "data", "legacy", 500, 20)
        assert set(keys_of(rows)) == set(acked)
        assert {r["value"] for r in rows} == set(acked.values())
        # a partition added later is followed too
        admin.create_partitions([NewPartitions("legacy", 3)])["legacy"].result(10)
        time.sleep(1)  # let the producer's metadata see the third partition
        acked.update(produce_json(broker.bootstrap, "legacy", [doc(i) for i in range(30)], 3))
        rows = wait_rows(tmp_path / "data", "legacy", 530, 20)
        assert set(keys_of(rows)) == set(acked) and max(keys_of(rows).values()) == 1
    finally:
        broker.stop()


def test_catalog_unavailable_then_catches_up(tmp_path: Path) -> None:
    import subprocess
    import sys

    broker = start(tmp_path)
    data = tmp_path / "data"
    try:
        create_table_topic(broker.bootstrap, "metrics", 1,
                           **{"table.topic.commit.interval.ms": "300"})
        acked = produce_json(broker.bootstrap, "metrics", [doc(i) for i in range(100)], 1)
        wait_rows(data, "metrics", 100, 15)
        metrics = broker.log().split("metrics on ", 1)[1].split()[0]
        lock = sqlite3.connect(data / "catalog.db", timeout=30, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # nobody else can read or write the catalog now
        stop = threading.Event()
        more: dict[tuple[int, int], bytes] = {}
        try:
            t = threading.Thread(target=lambda: more.update(produce_json(
                broker.bootstrap, "metrics", [doc(i) for i in range(100, 1100)], 1)))
            t.start()
            t.join(60)
            seen_error, lags = False, []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                out = subprocess.run(
                    [sys.executable, "-m", "broker.cli", "table", "status", "--metrics",
                     metrics, "--json"], capture_output=True, text=True, timeout=30,
                    check=True).stdout
                (status,) = json.loads(out)
                seen_error = seen_error or bool(status["last_error"])
                lags.append(status["partitions"][0]["lag_seconds"])
                time.sleep(1)
            assert seen_error, "the status never showed the catalog error"
            assert lags[-1] > lags[0] and status["partitions"][0]["lag_records"] == 1000
        finally:
            stop.set()
            lock.execute("ROLLBACK")
            lock.close()
        acked.update(more)
        rows = wait_rows(data, "metrics", 1100, 30)
        keys = keys_of(rows)
        assert set(keys) == set(acked) and max(keys.values()) == 1
    finally:
        broker.stop()


def test_postgresql_metadata_and_catalog(tmp_path: Path, pg_url: str) -> None:
    """The cluster set-up: metadata store and Iceberg catalog both in PostgreSQL."""
    broker = start(tmp_path, "--metadata", pg_url, "--catalog", pg_url)
    try:
        create_table_topic(broker.bootstrap, "pgt", 2)
        acked = produce_json(broker.bootstrap, "pgt", [doc(i) for i in range(400)], 2)
        cat = SqlCatalog("floe", uri="postgresql+psycopg://" + pg_url.split("://", 1)[1],
                         warehouse=(tmp_path / "data" / "warehouse").as_uri())
        deadline = time.monotonic() + 20
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline and len(rows) < 400:
            with contextlib.suppress(Exception):
                rows = cat.load_table(("default", "pgt")).scan().to_arrow().to_pylist()
            time.sleep(0.3)
        cat.engine.dispose()  # close its PostgreSQL connections
        assert set(keys_of(rows)) == set(acked) and max(keys_of(rows).values()) == 1
    finally:
        broker.stop()
