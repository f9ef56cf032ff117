"""The console and /status of brokers sharing one object store and metadata database (issue
18): each broker lists every live broker, marks itself and the controller, counts the
partitions each leads and shows each one's lease, as its /status says; the page of either
broker shows the same."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.integration.test_table_console import Ids

pytestmark = pytest.mark.integration


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        text: str = r.read().decode()
        return text


def settled(admin: str, partitions: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The brokers of /status once two are live, their leases read, and they lead every
    partition between them."""
    deadline = time.monotonic() + timeout
    while True:
        brokers: list[dict[str, Any]] = json.loads(get(f"http://{admin}/status"))["brokers"]
        if len(brokers) == 2 and sum(b["partitions_led"] for b in brokers) == partitions and \
                all(b["partitions_led"] and b["lease_expires_ms"] for b in brokers):
            return brokers
        assert time.monotonic() < deadline, brokers
        time.sleep(0.3)


def test_console_lists_the_live_brokers(tmp_path: Path) -> None:
    shared = ["--object-store", (tmp_path / "objects").resolve().as_uri(),
              "--metadata", f"sqlite:///{(tmp_path / 'meta.db').resolve()}",
              "--metrics", "127.0.0.1:0"]
    nodes = [BrokerProcess(tmp_path / f"b{n}", ["--node-id", str(n), *shared]) for n in (1, 2)]
    try:
        for b in nodes:
            b.start()
        client = AdminClient({"bootstrap.servers": nodes[0].bootstrap})
        client.create_topics([NewTopic("spread", 4, 1)])["spread"].result(10)
        for me, b in zip((1, 2), nodes, strict=True):
            admin = b.admin_address()
            brokers = settled(admin, 4)
            assert [x["node_id"] for x in brokers] == [1, 2]
            assert [x["this"] for x in brokers] == [me == 1, me == 2]
            assert sum(x["controller"] for x in brokers) == 1
            ids = Ids()
            ids.feed(get(f"http://{admin}/"))
            for x in brokers:
                row = ids.text[f"broker-{x['node_id']}"]
                assert f"{x['host']}:{x['port']}" in row
                lease = ids.text[f"lease-{x['node_id']}"]
                assert row.removesuffix(lease).endswith(str(x["partitions_led"]))
                # renewed every 0.5 s for 2 s, read every 1 s: never far from (0, 2]
                for left in (x["lease_remaining_s"], float(lease)):
                    assert -0.5 < left <= 2.0
                assert x["lease_expires_ms"] > 0
                assert ("this broker" in row) == x["this"]
                assert ("controller" in row) == x["controller"]
    finally:
        for b in nodes:
            b.stop()
