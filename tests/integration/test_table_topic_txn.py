"""A table topic fed by transactional producers holds what a read_committed consumer sees:
committed transactions and plain records, exactly once; no aborted record; nothing of an open
transaction until it commits. Its floe.offsets still reach the log end (aborted records and
markers are consumed)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tabletopic.contract import table_offsets
from tests.integration.test_table_topic import catalog, create_table_topic, start, table_rows
from tests.integration.test_transactions import txn_producer

pytestmark = pytest.mark.integration
TOPIC = "txntable"


def doc(tag: str, i: int) -> bytes:
    return json.dumps({"id": i, "tag": tag}).encode()


def rows_of(data_dir: Path) -> list[tuple[str, int]]:
    return sorted((r["tag"], r["id"]) for r in table_rows(data_dir, TOPIC))


def offsets_of(data_dir: Path) -> dict[int, int]:
    try:
        return table_offsets(catalog(data_dir).load_table(("default", TOPIC)))
    except Exception:
        return {}


def watermark(bootstrap: str, isolation: str) -> int:
    """The high watermark (read_uncommitted) or the last stable offset (read_committed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm",
                  "isolation.level": isolation})
    try:
        _lo, hi = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10, cached=False)
    finally:
        c.close()
    return int(hi)


def wait_offset(data_dir: Path, want: int, timeout: float = 30) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    got = offsets_of(data_dir)
    while got.get(0) != want and time.monotonic() < deadline:
        time.sleep(0.25)
        got = offsets_of(data_dir)
    return got


def expected(*parts: tuple[str, range]) -> list[tuple[str, int]]:
    return sorted((tag, i) for tag, ids in parts for i in ids)


def test_table_holds_committed_records_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = start(tmp_path)
    try:
        create_table_topic(broker.bootstrap, TOPIC, 1)
        tx = txn_producer(broker.bootstrap, "table-txn")
        tx.begin_transaction()
        for i in range(5):
            tx.produce(TOPIC, doc("committed", i), partition=0)
        tx.commit_transaction(30)
        tx.begin_transaction()
        for i in range(5):
            tx.produce(TOPIC, doc("aborted", i), partition=0)
        tx.flush(30)
        tx.abort_transaction(30)
        plain = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        for i in range(3):
            plain.produce(TOPIC, doc("plain", i), partition=0)
        assert plain.flush(30) == 0
        still_open = txn_producer(broker.bootstrap, "table-open")
        still_open.begin_transaction()
        for i in range(3):
            still_open.produce(TOPIC, doc("open", i), partition=0)
        still_open.flush(30)
        plain.produce(TOPIC, doc("after", 0), partition=0)  # behind the open transaction
        assert plain.flush(30) == 0

        lso = watermark(broker.bootstrap, "read_committed")
        assert lso < watermark(broker.bootstrap, "read_uncommitted")
        # the writer consumed everything up to the LSO (aborted records and markers too)
        assert wait_offset(data_dir, lso) == {0: lso}
        time.sleep(2.5)  # two more commit intervals: nothing of the open transaction comes
        assert offsets_of(data_dir) == {0: lso}
        assert rows_of(data_dir) == expected(("committed", range(5)), ("plain", range(3)))

        still_open.commit_transaction(30)
        end = watermark(broker.bootstrap, "read_uncommitted")
        assert watermark(broker.bootstrap, "read_committed") == end
        assert wait_offset(data_dir, end) == {0: end}
        rows: list[tuple[str, int]] = rows_of(data_dir)
        assert rows == expected(("committed", range(5)), ("plain", range(3)),
                                ("open", range(3)), ("after", range(1)))
        full: list[dict[str, Any]] = table_rows(data_dir, TOPIC)
        offsets = [r["_kafka"]["offset"] for r in full]
        assert len(set(offsets)) == len(offsets) == 12  # exactly once
    finally:
        broker.stop()


def test_every_third_transaction_aborted(tmp_path: Path) -> None:
    """Issue 16's criterion: a transactional producer aborting every third transaction over two
    partitions; the table holds exactly the committed records, each once."""
    data_dir = tmp_path / "data"
    broker = start(tmp_path)
    try:
        create_table_topic(broker.bootstrap, TOPIC, 2)
        tx = txn_producer(broker.bootstrap, "table-thirds")
        want: list[tuple[str, int]] = []
        for t in range(12):
            tx.begin_transaction()
            for i in range(10):
                tx.produce(TOPIC, doc(f"t{t}", i), partition=i % 2)
            if t % 3 == 2:
                tx.flush(30)
                tx.abort_transaction(30)
            else:
                tx.commit_transaction(30)
                want += [(f"t{t}", i) for i in range(10)]
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "wm"})
        try:
            ends = {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10,
                                               cached=False)[1] for p in range(2)}
        finally:
            c.close()
        deadline = time.monotonic() + 30
        while offsets_of(data_dir) != ends and time.monotonic() < deadline:
            time.sleep(0.25)
        assert offsets_of(data_dir) == ends
        full = table_rows(data_dir, TOPIC)
        assert sorted((r["tag"], r["id"]) for r in full) == sorted(want)
        keys = [(r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in full]
        assert len(set(keys)) == len(keys) == len(want)
    finally:
        broker.stop()
