"""The web console (admin port `/`) and per-stage freshness against a real broker: the page
shows the same lag, dead-letter count and writer state as /status, and the snapshots; the
freshness stages are in /status and /metrics."""

from __future__ import annotations

import json
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.tableops import (
    cli,
    current_snapshot,
    produce,
    status,
    wait_keys,
    wait_status,
)
from tests.integration.test_table_topic import create_table_topic, start

pytestmark = pytest.mark.integration


class Ids(HTMLParser):
    """The text of every element with an id."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str | None] = []
        self.text: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("meta", "br", "link"):
            return
        self.stack.append(dict(attrs).get("id"))

    def handle_endtag(self, tag: str) -> None:
        if self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        for i in self.stack:
            if i is not None:
                self.text[i] = self.text.get(i, "") + data


def get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode()


def test_console_shows_lag_dlq_and_freshness(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start(tmp_path)
    try:
        admin = broker.admin_address()
        create_table_topic(broker.bootstrap, "web", 2, **{"table.topic.commit.interval.ms": "300"})
        acked = produce(broker.bootstrap, "web", [*({"n": i} for i in range(40)), b"{bad",
                                                  b"[1]", b"{bad"], 2)
        bad = {(0, 20), (1, 20), (0, 21)}
        wait_keys(data, "web", set(acked) - bad)
        wait_status(admin, "web", lambda s: s["dead_letters"] == 3)

        # a consumer group that read partition 0 up to offset 15
        group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g1",
                          "enable.auto.commit": False})
        group.commit(offsets=[TopicPartition("web", 0, 15)], asynchronous=False)
        group.close()

        # paused with records waiting: lag, and the stages' ages grow
        assert cli(admin, "pause", "web", "--reason", "console check")[0] == 0
        wait_status(admin, "web", lambda s: s["paused"] == "console check")
        get(f"http://{admin}/")  # the throughput ring's first sample
        produce(broker.bootstrap, "web", [{"n": i} for i in range(100, 120)], 2)
        time.sleep(1.2)
        ctype, body = get(f"http://{admin}/")
        st = status(admin, "web")
        assert ctype.startswith("text/html")
        ids = Ids()
        ids.feed(body)
        assert ids.text["dlq-web"] == str(st["dead_letters"]) == "3"
        for p in st["partitions"]:
            assert ids.text[f"lag-web-{p['partition']}"] == str(p["lag_records"]) == "10"
        assert "PAUSED: console check" in ids.text["state-web"]
        assert ids.text["healthy"] == "healthy"
        assert str(current_snapshot(data, "web")) + " (current)" in body
        assert ids.text["group-lag-g1-web-0"] == str(32 - 15)  # 22 + 10 records in partition 0
        assert "Object store requests" in body
        # brokers, topics with bytes and throughput, costs: as /status has them (the paused
        # writer neither reads nor writes; the page's lineage reads count as table GETs)
        full = json.loads(get(f"http://{admin}/status")[1])
        (me,) = full["brokers"]
        assert "this broker" in ids.text[f"broker-{me['node_id']}"]
        (web,) = [t for t in full["topics"] if t["topic"] == "web"]
        for p in web["partitions"]:
            pid = f"web-{p['partition']}"
            assert ids.text[f"bytes-in-{pid}"] == str(p["bytes_in"])
            assert ids.text[f"bytes-out-{pid}"] == str(p["bytes_out"])
            assert float(ids.text[f"rate-in-{pid}"]) > 0  # 10 records came in since the sample
            assert p["bytes_in"] > 0 and p["bytes_out"] > 0  # the writer read the first ones
        for op, c in full["costs"]["topics"]["web"].items():
            assert ids.text[f"cost-web-{op}-requests"] == f"{c['requests']:.2f}"
            assert ids.text[f"cost-web-{op}-bytes"] == f"{c['bytes']:.0f}"
        assert float(ids.text["cost-web-PUT-bytes"]) > 0
        put = st["costs"]["PUT"]
        assert ids.text["tcost-web-PUT-requests"] == f"{put['requests']:.0f}"
        assert ids.text["tcost-web-PUT-bytes"] == f"{put['bytes']:.0f}"
        time.sleep(0.6)
        ids = Ids()
        ids.feed(get(f"http://{admin}/")[1])
        assert ids.text["rate-in-web-0"] == ids.text["rate-in-web-1"] == "0.0"  # nothing new
        fresh = st["freshness"]["partitions"]
        assert [f["converted_offset"] for f in fresh] == [22, 21]
        assert all(f["ack_to_converted_seconds"] >= 1.0 for f in fresh)
        assert all(f["ack_to_committed_seconds"] >= 1.0 for f in fresh)

        # resumed: every stage catches up; the metrics carry the stages
        assert cli(admin, "resume", "web")[0] == 0
        # both partitions listed: a writer that just started lists none yet (and all() of
        # nothing is true), which let this pass before the writer had its partitions again
        st = wait_status(admin, "web", lambda s: len(s["freshness"]["partitions"]) == 2 and all(
            f["ack_to_committed_seconds"] == 0 and f["committed_offset"] == f["acked_offset"]
            for f in s["freshness"]["partitions"]))
        assert st["freshness"]["last_commit_seconds"] > 0
        _, text = get(f"http://{admin}/metrics")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        conv = {s.labels["partition"]: s.value
                for s in families["floe_table_convert_lag_seconds"].samples
                if s.labels["topic"] == "web"}
        assert conv == {"0": 0.0, "1": 0.0}
        (took,) = [s.value for s in families["floe_table_last_commit_duration_seconds"].samples
                   if s.labels["topic"] == "web"]
        assert took > 0
        ids = Ids()
        ids.feed(get(f"http://{admin}/")[1])
        assert ids.text["state-web"] == "running" and ids.text["lag-web-0"] == "0"
    finally:
        broker.stop()
