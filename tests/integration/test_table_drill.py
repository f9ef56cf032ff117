"""The "bad deploy" drill of issue 18, end to end on a real broker: a table topic ingests; a bad
converter setting is deployed (its records go to the dead-letter topic); it is fixed;
`replay-dlq` brings them in; the table is rolled back to a snapshot before the incident and
catches up again; `rebuild` from an offset; at the end the table equals the topic exactly once
(every offset once, with its value) and `lineage` tells the story."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.brokerproc import BrokerProcess
from tests.integration.tableops import (
    alter,
    cli,
    cli_json,
    current_snapshot,
    produce,
    wait_keys,
    wait_status,
)
from tests.integration.test_schema_registry import registry_address
from tests.integration.test_table_topic import create_table_topic, start
from tests.kafkaread import consume_all

pytestmark = pytest.mark.integration
TOPIC = "drill"
BAD = {"table.topic.convert.value.type": "by_latest_schema"}  # no registry: every record fails
GOOD = {"table.topic.convert.value.type": "json"}


def deploy(bootstrap: str, admin: str, cfg: dict[str, str]) -> None:
    """Change the converter and wait until the topic's writer runs with it."""
    alter(bootstrap, TOPIC, cfg)
    wait_status(admin, TOPIC, lambda s: s["value_type"] == cfg["table.topic.convert.value.type"])
    time.sleep(1.5)  # the writer is restarted on its next poll (0.5 s)


def test_bad_deploy_drill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start(tmp_path)
    try:
        boot, admin = broker.bootstrap, broker.admin_address()
        create_table_topic(boot, TOPIC, 2, **{"table.topic.commit.interval.ms": "300"})
        acked = produce(boot, TOPIC, [{"n": i, "phase": "before"} for i in range(100)], 2)
        wait_keys(data, TOPIC, set(acked))
        before_incident = current_snapshot(data, TOPIC)

        # the incident: a bad converter setting sends every record to the dead-letter topic
        deploy(boot, admin, BAD)
        incident = produce(boot, TOPIC, [{"n": i, "phase": "incident"} for i in range(100, 160)],
                           2)
        acked |= incident
        wait_status(admin, TOPIC, lambda s: s["dead_letters"] == 60
                    and all(p["lag_records"] == 0 for p in s["partitions"]))
        wait_keys(data, TOPIC, set(acked) - set(incident))

        # fixed; new records flow again, the dead letters are replayed, once
        # (plus one record that no setting makes a row: it stays a dead letter)
        deploy(boot, admin, GOOD)
        after: list[dict[str, Any] | bytes] = [{"n": i, "phase": "after"} for i in range(160, 200)]
        acked |= produce(boot, TOPIC, [*after, b"{not json"], 2)
        broken = {(0, 100)}
        wait_status(admin, TOPIC, lambda s: all(p["lag_records"] == 0 for p in s["partitions"]))
        wait_keys(data, TOPIC, set(acked) - set(incident) - broken)
        dry = cli_json(admin, "replay-dlq", TOPIC, "--dry-run")
        assert (dry["dead_letters"], dry["replayed"], dry["snapshot"]) == (61, 60, None)
        assert current_snapshot(data, TOPIC) != before_incident
        replay = cli_json(admin, "replay-dlq", TOPIC)
        assert replay["replayed"] == 60 and replay["snapshot"]
        assert [(b["partition"], b["offset"]) for b in replay["still_bad"]] == sorted(broken)
        rows = wait_keys(data, TOPIC, set(acked) - broken, timeout=5)
        again = cli_json(admin, "replay-dlq", TOPIC)
        assert (again["replayed"], again["already_in_table"], again["snapshot"]) == (0, 60, None)

        # roll back to before the incident: the writer re-materialises the rest from the log
        # (with the fixed converter); the replayed rows went with the rollback, and a replay
        # now finds every dead letter already in the table
        code, _, err = cli(admin, "rollback", TOPIC, "--to-snapshot", str(before_incident))
        assert code == 0, err
        wait_keys(data, TOPIC, set(acked) - broken)
        assert cli_json(admin, "replay-dlq", TOPIC)["replayed"] == 0

        # rebuild one partition from an offset inside the incident
        assert cli(admin, "rebuild", TOPIC, "--from-offset", "1:55")[0] == 0
        rows = wait_keys(data, TOPIC, set(acked) - broken)

        # the table is the topic, exactly once, values included; the DLQ holds each dead
        # letter once (the incident's and the broken record)
        got = {(r["_kafka"]["partition"], r["_kafka"]["offset"]): (r["n"], r["phase"])
               for r in rows}
        want = {k: (json.loads(v)["n"], json.loads(v)["phase"]) for k, v in acked.items()
                if k not in broken}
        assert got == want
        dead = consume_all(boot, f"{TOPIC}.dlq", 1)
        assert sorted(dead.values()) == sorted([acked[k] for k in incident] + [b"{not json"])

        # lineage tells the story: ingest, the all-DLQ commits, the replay, the rolled-back
        # snapshots, the rebuild, the catch-up
        story = cli_json(admin, "lineage", TOPIC)
        ops = [s["operation"] for s in story["snapshots"]]
        assert "replay-dlq" in ops and "rebuild" in ops
        replayed = [s for s in story["snapshots"] if s["operation"] == "replay-dlq"]
        assert replayed[0]["rolled_back"] and replayed[0]["added_records"] == 60
        assert replayed[0]["dlq_offsets"] == [[0, 60]]
        assert [h["snapshot"] for h in story["history"]].count(before_incident) == 2
        code, text, _ = cli(admin, "lineage", TOPIC)
        print(text)
        assert "replay-dlq" in text and "rebuild" in text and "x " in text
        assert f"{before_incident} made current again" in text
        hit = cli_json(admin, "locate", TOPIC, "--partition", "0", "--offset", "60")["snapshot"]
        assert hit is not None and not hit["rolled_back"]
    finally:
        broker.stop()


def test_replay_after_the_schema_is_registered(tmp_path: Path) -> None:
    """by_latest_schema before the subject has a schema: every record is a dead letter; the
    schema is registered, new records flow, replay-dlq brings the old ones in with the typed
    columns and their original offsets, once."""
    data = tmp_path / "data"
    broker = BrokerProcess(data_dir=data, registry_listen="127.0.0.1:0",
                           extra_args=["--metrics", "127.0.0.1:0"]).start()
    try:
        boot, admin = broker.bootstrap, broker.admin_address()
        create_table_topic(boot, "reg", 1, **{"table.topic.convert.value.type": "by_latest_schema",
                                              "table.topic.commit.interval.ms": "300"})
        early = produce(boot, "reg", [{"id": i, "name": f"n{i}"} for i in range(10)], 1)
        wait_status(admin, "reg", lambda s: s["dead_letters"] == 10
                    and s["partitions"][0]["lag_records"] == 0)
        schema = {"type": "object", "properties": {"id": {"type": "integer"},
                                                   "name": {"type": "string"}}}
        req = urllib.request.Request(
            f"http://{registry_address(broker)}/subjects/reg-value/versions",
            data=json.dumps({"schemaType": "JSON", "schema": json.dumps(schema)}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert "id" in json.loads(r.read())
        late = produce(boot, "reg", [{"id": i, "name": f"n{i}"} for i in range(10, 15)], 1)
        wait_keys(data, "reg", set(late))
        replay = cli_json(admin, "replay-dlq", "reg")
        assert (replay["replayed"], replay["still_bad"]) == (10, [])
        rows = wait_keys(data, "reg", set(early) | set(late), timeout=5)
        assert sorted((r["_kafka"]["offset"], r["id"], r["name"]) for r in rows) == [
            (i, i, f"n{i}") for i in range(15)]
        assert cli_json(admin, "replay-dlq", "reg")["replayed"] == 0
    finally:
        broker.stop()
