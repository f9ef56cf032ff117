"""Object-store cost figures per topic and per table (issue 18), on a broker process with the
local (file://) store and with S3 (moto's server): records produced to two topics in a known
proportion; the topics' PUT bytes add up to every WAL object's bytes and split in that
proportion, and reads are paid by the topic read; /status and /metrics carry the same
figures; a table topic's per-table PUT count and bytes grow with its commits."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.brokerproc import BrokerProcess
from tests.integration.tableops import cli, produce, status, wait_status
from tests.integration.test_table_topic import create_table_topic
from tests.kafkaread import consume_all
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV, moto_s3

pytestmark = pytest.mark.integration

BUCKET = "floe-costs"
VALUE = 1000  # bytes per record; batch overhead is small next to it


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for k, v in TEST_AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in UNSET_AWS_ENV:
        monkeypatch.delenv(k, raising=False)
    with moto_s3() as endpoint:
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        c.create_bucket(Bucket=BUCKET)
        c.close()
        yield endpoint


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        text: str = r.read().decode()
        return text


def samples(admin: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(fetch(f"http://{admin}/metrics")):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def produce_interleaved(bootstrap: str, counts: dict[str, int]) -> None:
    """`counts[topic]` records of VALUE bytes each, the topics interleaved so that WAL objects
    mix them."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    left = dict(counts)
    while any(left.values()):
        for topic in counts:
            if left[topic]:
                p.produce(topic, b"x" * VALUE)
                left[topic] -= 1
        p.poll(0)
    assert p.flush(30) == 0


def check_topic_costs(broker: BrokerProcess) -> None:
    admin = broker.admin_address()
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in client.create_topics([NewTopic("big", 2, 1), NewTopic("small", 1, 1)]).values():
        f.result(10)
    time.sleep(0.5)
    produce_interleaved(broker.bootstrap, {"big": 600, "small": 200})
    doc: dict[str, Any] = json.loads(fetch(f"http://{admin}/status"))
    m = samples(admin)
    costs = doc["costs"]
    put = {t: ops["PUT"]["bytes"] for t, ops in costs["topics"].items() if "PUT" in ops}
    total_put = costs["totals"]["PUT"]["bytes"]
    # no compaction yet (30 s interval): every PUT is a WAL object, all of it attributed
    assert "PUT" not in costs["unattributed"]
    assert set(put) == {"big", "small"}
    assert abs(sum(put.values()) - total_put) < 1e-3 * total_put
    assert 600 * VALUE < put["big"] < 600 * VALUE * 1.1
    assert 200 * VALUE < put["small"] < 200 * VALUE * 1.1
    assert abs(put["big"] / put["small"] - 3.0) < 0.1
    # requests: fractions of the WAL PUTs, adding up to them
    reqs = sum(ops["PUT"]["requests"] for ops in costs["topics"].values())
    assert abs(reqs - costs["totals"]["PUT"]["requests"]) < 1e-6
    # /metrics: the same figures
    by_topic = {d["topic"]: v for d, v in m["floe_topic_object_store_bytes_total"]
                if d["op"] == "PUT"}
    assert by_topic.keys() == put.keys()
    for t, v in by_topic.items():
        assert v == pytest.approx(put[t], rel=0.01)  # traffic may continue between requests
    # traffic per partition: bytes in of what was produced
    bins = {(d["topic"], d["partition"]): v for d, v in m["floe_partition_bytes_in_total"]}
    assert 200 * VALUE < bins[("small", "0")] < 200 * VALUE * 1.1
    assert 600 * VALUE < bins[("big", "0")] + bins[("big", "1")] < 600 * VALUE * 1.1
    # reads (no chunk cache: every read is a GET): the topic read pays for them
    assert len(consume_all(broker.bootstrap, "small", 1)) == 200
    costs = json.loads(fetch(f"http://{admin}/status"))["costs"]
    assert costs["topics"]["small"]["GET"]["bytes"] >= 200 * VALUE
    assert "GET" not in costs["topics"]["big"] and "GET" not in costs["unattributed"]


def test_costs_per_topic_on_the_file_store(tmp_path: Path) -> None:
    broker = BrokerProcess(data_dir=tmp_path / "data", extra_args=[
        "--metrics", "127.0.0.1:0", "--set", "cache.max.bytes=0"]).start()
    try:
        check_topic_costs(broker)
    finally:
        broker.stop()


def test_costs_per_topic_on_s3(tmp_path: Path, s3_endpoint: str) -> None:
    store = f"s3://{BUCKET}/log?endpoint={s3_endpoint}&region=us-east-1&path_style=true"
    broker = BrokerProcess(data_dir=tmp_path / "data",
                           extra_args=["--metrics", "127.0.0.1:0", "--object-store", store,
                                       "--set", "cache.max.bytes=0"]).start()
    try:
        check_topic_costs(broker)
    finally:
        broker.stop()


def test_table_costs_grow_with_commits(tmp_path: Path) -> None:
    broker = BrokerProcess(data_dir=tmp_path / "data",
                           extra_args=["--metrics", "127.0.0.1:0"]).start()
    try:
        admin = broker.admin_address()
        create_table_topic(broker.bootstrap, "priced", 1,
                           **{"table.topic.commit.interval.ms": "300"})
        seen: list[tuple[int, float, float]] = []  # (commits, PUT requests, PUT bytes)
        for round_ in range(3):
            produce(broker.bootstrap, "priced", [{"n": i} for i in range(20 * round_,
                                                                          20 * round_ + 20)], 1)
            st = wait_status(admin, "priced", lambda s, r=round_: s["rows"] == 20 * (r + 1))
            put = st["costs"]["PUT"]
            seen.append((st["commits"], put["requests"], put["bytes"]))
        commits = [c for c, _, _ in seen]
        assert commits == sorted(commits) and commits[-1] > commits[0]
        # each commit writes a data file, a manifest, a manifest list and a metadata file
        assert [r for _, r, _ in seen] == sorted(r for _, r, _ in seen)
        assert seen[-1][1] - seen[0][1] >= 4 * (commits[-1] - commits[0])
        assert seen[-1][2] > seen[0][2] > 0
        assert st["costs"]["GET"]["requests"] > 0
        m = samples(admin)
        (req,) = [v for d, v in m["floe_table_object_store_requests_total"]
                  if d["topic"] == "priced" and d["op"] == "PUT"]
        assert req >= seen[-1][1]
        # `floe table status` prints them (the writer is idle: they hold still)
        st = status(admin, "priced")
        code, out, _err = cli(admin, "status")
        assert code == 0
        put = st["costs"]["PUT"]
        assert f"PUT {put['requests']:.0f} ({put['bytes']:.0f} B)" in out
    finally:
        broker.stop()


def test_compaction_costs_go_to_the_topics(tmp_path: Path) -> None:
    """Compaction reads WAL objects (GET split by the topics' bytes in them), writes stream
    objects (PUT of one topic each) and deletes the WAL objects (DELETE: shared, unattributed)."""
    broker = BrokerProcess(data_dir=tmp_path / "data", extra_args=[
        "--metrics", "127.0.0.1:0", "--set", "compaction.interval.ms=300",
        "--set", "compaction.min.age.ms=0", "--set", "objects.gc.delay.ms=0"]).start()
    try:
        admin = broker.admin_address()
        client = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in client.create_topics([NewTopic("big", 1, 1), NewTopic("small", 1, 1)]).values():
            f.result(10)
        produce_interleaved(broker.bootstrap, {"big": 300, "small": 100})
        deadline = time.monotonic() + 30
        while True:
            costs = json.loads(fetch(f"http://{admin}/status"))["costs"]
            if "DELETE" in costs["unattributed"] and all(
                    "GET" in costs["topics"].get(t, {}) for t in ("big", "small")):
                break
            assert time.monotonic() < deadline, costs
            time.sleep(0.3)
        get = {t: costs["topics"][t]["GET"]["bytes"] for t in ("big", "small")}
        assert abs(get["big"] / get["small"] - 3.0) < 0.1
        assert "GET" not in costs["unattributed"]
        # PUTs: the WAL objects' (split) plus the stream objects' (one topic each)
        put = {t: costs["topics"][t]["PUT"]["bytes"] for t in ("big", "small")}
        assert put["big"] > 2 * 300 * VALUE and put["small"] > 2 * 100 * VALUE
        assert "PUT" not in costs["unattributed"]
    finally:
        broker.stop()
