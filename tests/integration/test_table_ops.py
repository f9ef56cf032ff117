"""`floe table lineage|locate|pause|resume|rollback|rebuild` against a real broker: after each
operation the table holds every offset of the topic exactly once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.integration.tableops import (
    cli,
    cli_json,
    current_snapshot,
    keys,
    produce,
    status,
    wait_keys,
    wait_status,
)
from tests.integration.test_table_topic import create_table_topic, start, table_rows

pytestmark = pytest.mark.integration


def test_lineage_locate_pause_rollback_rebuild(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start(tmp_path)
    try:
        admin = broker.admin_address()
        create_table_topic(broker.bootstrap, "ops", 2, **{"table.topic.commit.interval.ms": "300"})
        acked = produce(broker.bootstrap, "ops", [{"n": i} for i in range(100)], 2)
        wait_keys(data, "ops", set(acked))
        first = current_snapshot(data, "ops")

        # lineage: the snapshots' ranges cover every offset once; locate finds each record
        doc = cli_json(admin, "lineage", "ops")
        assert doc["current"] == first
        covered = sorted((int(p), o) for s in doc["snapshots"] for p, (a, b) in
                         s["ranges"].items() for o in range(a or 0, b))
        assert covered == sorted(acked)
        hit = cli_json(admin, "locate", "ops", "--partition", "1", "--offset", "49")["snapshot"]
        a, b = hit["ranges"]["1"]
        assert (a or 0) <= 49 < b
        assert cli_json(admin, "locate", "ops", "--partition", "1", "--offset", "50")[
            "snapshot"] is None
        code, out, _ = cli(admin, "lineage", "ops")
        assert code == 0 and str(first) in out and "p1:[" in out

        # pause: nothing is written, status says so; resume: everything comes in once
        assert cli(admin, "pause", "ops", "--reason", "drill")[0] == 0
        wait_status(admin, "ops", lambda s: s["paused"] == "drill")
        acked |= produce(broker.bootstrap, "ops", [{"n": i} for i in range(100, 160)], 2)
        code, out, _ = cli(admin, "status")
        assert code == 0 and "PAUSED: drill" in out and "UNCONVERTED s" in out
        time.sleep(1.5)  # several commit intervals
        assert current_snapshot(data, "ops") == first
        assert len(table_rows(data, "ops")) == 100
        assert cli(admin, "resume", "ops")[0] == 0
        wait_keys(data, "ops", set(acked))
        assert status(admin, "ops")["paused"] is None

        # rollback to the first snapshot: the records after it are written again, once
        code, out, err = cli(admin, "rollback", "ops", "--to-snapshot", str(first))
        assert code == 0, err
        assert "rolled back" in out
        wait_keys(data, "ops", set(acked))
        doc = cli_json(admin, "lineage", "ops")
        assert any(s["rolled_back"] for s in doc["snapshots"])
        assert first in [h["snapshot"] for h in doc["history"]]

        # rebuild from an offset, then everything: one commit, so the table is whole at once
        doc = cli_json(admin, "rebuild", "ops", "--from-offset", "0:20")
        assert (doc["rows"], doc["dead_letters"]) == (60, 0)
        assert keys(table_rows(data, "ops")) == Counter(list(acked))
        assert current_snapshot(data, "ops") == doc["snapshot"]
        rebuilds = [s for s in cli_json(admin, "lineage", "ops")["snapshots"]
                    if s["operation"] == "rebuild"]  # a delete, rewrites, an append
        assert all(s["rebuilt"] == {"0": [20, 80]} and not s["ranges"] for s in rebuilds)
        assert rebuilds[-1]["current"] and rebuilds[-1]["total_records"] == 160
        hit = cli_json(admin, "locate", "ops", "--partition", "0", "--offset", "25")["snapshot"]
        assert hit["snapshot_id"] == doc["snapshot"]
        code, out, _ = cli(admin, "rebuild", "ops", "--all")
        assert code == 0 and "160 rows rewritten" in out
        assert keys(table_rows(data, "ops")) == Counter(list(acked))

        # refused: the log no longer holds what the rollback would need; nothing changes
        kafka = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in kafka.delete_records([TopicPartition("ops", 1, 60)]).values():
            f.result(10)
        before = current_snapshot(data, "ops")
        code, _, err = cli(admin, "rollback", "ops", "--to-snapshot", str(first))
        assert code == 1 and "log starts at 60" in err
        code, _, err = cli(admin, "rebuild", "ops", "--from-offset", "1:10")
        assert code == 1 and "log starts at 60" in err
        assert current_snapshot(data, "ops") == before
        assert status(admin, "ops")["paused"] is None
        # a partition added after the snapshot is written again from offset 0: refused too
        # once the log no longer starts there
        no_p2 = current_snapshot(data, "ops")
        kafka.create_partitions([NewPartitions("ops", 3)])["ops"].result(10)
        wait_status(admin, "ops", lambda s: len(s["partitions"]) == 3)
        p2 = produce(broker.bootstrap, "ops", [{"n": i} for i in range(200, 212)], 3)
        wait_status(admin, "ops", lambda s: all(p["lag_records"] == 0 for p in s["partitions"]))
        fresh = AdminClient({"bootstrap.servers": broker.bootstrap})  # knows partition 2
        for f in fresh.delete_records([TopicPartition("ops", 2, 2)]).values():
            f.result(10)
        code, _, err = cli(admin, "rollback", "ops", "--to-snapshot", str(no_p2))
        assert code == 1 and "partition 2: offset 0 is needed but the log starts at 2" in err
        assert len(p2) == 12
        # bad arguments
        assert cli(admin, "rollback", "ops", "--to-snapshot", "12345")[0] == 1
        assert cli(admin, "rebuild", "ops")[0] == 2
        assert cli(admin, "lineage", "nope")[0] == 1
    finally:
        broker.stop()


def test_pause_survives_a_restart_and_upsert_tables(tmp_path: Path) -> None:
    """The pause is in the metadata store: a restarted broker's writer stays paused. An upsert
    table refuses a partial rebuild and a DLQ replay; rebuild --all rewinds it and the writer
    writes the log again, merging by key."""
    data = tmp_path / "data"
    broker = start(tmp_path)
    try:
        admin = broker.admin_address()
        create_table_topic(broker.bootstrap, "up", 1, **{
            "table.topic.commit.interval.ms": "300", "table.topic.upsert.enable": "true",
            "table.topic.id.columns": "[id]"})
        produce(broker.bootstrap, "up", [{"id": i % 5, "v": i} for i in range(20)], 1)
        wait_status(admin, "up", lambda s: s["partitions"][0]["lag_records"] == 0)
        assert cli(admin, "pause", "up", "--reason", "maintenance")[0] == 0
    finally:
        broker.stop()
    broker = start(tmp_path)
    try:
        admin = broker.admin_address()
        wait_status(admin, "up", lambda s: s["paused"] == "maintenance")
        before = current_snapshot(data, "up")
        produce(broker.bootstrap, "up", [{"id": 9, "v": 100}], 1)
        time.sleep(1.5)
        assert current_snapshot(data, "up") == before
        code, _, err = cli(admin, "rebuild", "up", "--from-offset", "0:3")
        assert code == 1 and "upsert table" in err
        code, _, err = cli(admin, "replay-dlq", "up")
        assert code == 1 and "upsert table" in err
        code, out, err = cli(admin, "rebuild", "up", "--all")
        assert code == 0 and "writer writes the log again" in out, err
        assert status(admin, "up")["paused"] == "maintenance"  # an operator's pause stays
        assert cli(admin, "resume", "up")[0] == 0
        want = {i: 15 + i for i in range(5)} | {9: 100}
        deadline = time.monotonic() + 20
        while {r["id"]: r["v"] for r in table_rows(data, "up")} != want:
            assert time.monotonic() < deadline, table_rows(data, "up")
            time.sleep(0.3)
        assert len(table_rows(data, "up")) == 6
    finally:
        broker.stop()
