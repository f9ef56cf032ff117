"""The admin port of a real broker process: /metrics (parsed with prometheus_client's own
parser) after real librdkafka traffic, /status health on file and S3, an S3 endpoint that is
dead or refuses us, and `floe table status` / `/metrics` with no flags on the default port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tests.brokerproc import BrokerProcess
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV, error_endpoint, stalled_endpoint

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        body: bytes = r.read()
        return body


def scrape(admin: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(get(f"http://{admin}/metrics").decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of `name` over every series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lv), v in samples.items() if n == name and want <= set(lv))


def status(admin: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(get(f"http://{admin}/status"))
    return doc


def test_metrics_follow_real_traffic_and_group_lag_matches_describe(
    broker: BrokerProcess,
) -> None:
    admin = broker.admin_address()
    before = scrape(admin)
    assert total(before, "floe_requests_total", api="Produce") == 0
    value = b"v" * 100
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(200):
        p.produce("metered", value, key=str(i).encode())
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "meter",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        c.subscribe(["metered"])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 120 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen += 1
        assert seen == 120
        c.commit(offsets=[TopicPartition("metered", 0, 120)], asynchronous=False)
        after = scrape(admin)
        out = subprocess.run(
            [sys.executable, "-m", "broker.cli", "groups", "describe", "meter",
             "--bootstrap", broker.bootstrap, "--json"],
            capture_output=True, text=True, timeout=30, cwd=ROOT, check=True).stdout
    finally:
        c.close()
    assert total(after, "floe_requests_total", api="Produce") >= 1
    assert total(after, "floe_requests_total", api="Fetch") >= 1
    assert total(after, "floe_requests_total", api="OffsetCommit") >= 1
    assert total(after, "floe_request_latency_seconds_count", api="Produce") >= 1
    assert total(after, "floe_network_bytes_in_total") >= 200 * len(value)
    assert total(after, "floe_network_bytes_out_total") >= 120 * len(value)
    assert total(after, "floe_wal_flushes_total") > 0
    assert 0 < total(after, "floe_wal_commits_total") <= total(after, "floe_wal_flushes_total")
    assert total(after, "floe_wal_flush_bytes_sum") >= 200 * len(value)
    assert total(after, "floe_object_store_requests_total", op="PUT") > 0
    assert total(after, "floe_object_store_errors_total") == 0
    assert total(after, "floe_cache_hits_total") > 0  # consumers read what was just written
    assert total(after, "floe_topics") >= 1 and total(after, "floe_connections") >= 1
    # lag computed by the broker at scrape time == what `floe groups describe` computes
    row = {(r["topic"], r["partition"]): r for r in json.loads(out)["partitions"]}[("metered", 0)]
    assert (row["committed"], row["end"], row["lag"]) == (120, 200, 80)
    key = (("group", "meter"), ("partition", "0"), ("topic", "metered"))
    assert after[("floe_group_lag_records", key)] == row["lag"]
    assert after[("floe_group_committed_offset", key)] == row["committed"]
    assert after[("floe_health_ok", (("component", "object_store"),))] == 1
    health = status(admin)["health"]
    assert health["healthy"] is True, health
    assert {n: c["ok"] for n, c in health["components"].items()} == {
        "object_store": True, "metadata": True, "catalog": True}


def _s3_env() -> dict[str, str]:
    return {**TEST_AWS_ENV, **dict.fromkeys(UNSET_AWS_ENV, "")}


def test_broker_on_a_refusing_s3_endpoint_says_so_and_reports_unhealthy(tmp_path: Path) -> None:
    with error_endpoint(403, "AccessDenied") as (endpoint, seen):
        url = f"s3://nobucket/log?endpoint={endpoint}&region=us-east-1"
        b = BrokerProcess(tmp_path / "d", ["--object-store", url], _s3_env()).start()
        try:
            log = b.log()
            before_listening = log.split("listening on", 1)[0]
            assert "ERROR" in before_listening and "object store" in before_listening
            assert endpoint in before_listening and "AccessDenied" in before_listening
            doc = status(b.admin_address())
            c = doc["health"]["components"]["object_store"]
            assert doc["health"]["healthy"] is False and c["ok"] is False
            assert "AccessDenied" in c["last_error"] and c["last_error_at"] > 0
            assert doc["health"]["components"]["metadata"]["ok"] is True
            assert any(r.startswith("GET ") for r in seen)
            r = subprocess.run(
                [sys.executable, "-m", "broker.cli", "table", "status", "--metrics",
                 b.admin_address()], capture_output=True, text=True, timeout=30, cwd=ROOT)
            assert r.returncode == 0, r.stderr
            first = r.stdout.splitlines()[0]
            assert first.startswith(f"UNHEALTHY object_store {url}: ") and "AccessDenied" in first
        finally:
            b.stop()


def test_broker_on_a_dead_s3_endpoint_says_so_and_reports_unhealthy(tmp_path: Path) -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    url = f"s3://b/log?endpoint=http://127.0.0.1:{port}&region=us-east-1"
    b = BrokerProcess(tmp_path / "d", ["--object-store", url], _s3_env()).start()
    try:
        before_listening = b.log().split("listening on", 1)[0]
        assert f"object store s3://b/log?endpoint=http://127.0.0.1:{port}" in before_listening
        assert "unreachable" in before_listening and "ERROR" in before_listening
        c = status(b.admin_address())["health"]["components"]["object_store"]
        assert c["ok"] is False and c["last_error"]
        scraped = scrape(b.admin_address())
        assert scraped[("floe_health_ok", (("component", "object_store"),))] == 0
    finally:
        b.stop()


@pytest.mark.slow
def test_broker_on_a_stalled_s3_endpoint_says_so_within_the_probe_timeout(
    tmp_path: Path,
) -> None:
    with stalled_endpoint() as endpoint:
        url = f"s3://b/log?endpoint={endpoint}&region=us-east-1"
        started = time.monotonic()
        b = BrokerProcess(tmp_path / "d", ["--object-store", url], _s3_env()).start()
        try:
            assert time.monotonic() - started < 20  # the probe's 5 s bound, plus start-up
            before_listening = b.log().split("listening on", 1)[0]
            assert f"object store {url} is unreachable: no answer within" in before_listening
            doc = status(b.admin_address())
            assert doc["health"]["healthy"] is False
            assert "no answer within" in doc["health"]["components"]["object_store"]["last_error"]
        finally:
            b.stop()


def _port_free(port: int) -> bool:
    try:
        socket.create_server(("127.0.0.1", port)).close()
        return True
    except OSError:
        return False


@pytest.mark.admin_default_port
def test_table_status_and_metrics_with_no_flags_on_the_default_admin_port(
    tmp_path: Path,
) -> None:
    """The only test that lets the broker bind its default admin port 127.0.0.1:9644."""
    assert _port_free(9644), "127.0.0.1:9644 is taken: is a floe broker running outside tests?"
    b = BrokerProcess(tmp_path / "d", admin_listen=None).start()
    try:
        assert b.admin_address() == "127.0.0.1:9644"
        env = {k: v for k, v in os.environ.items() if k != "FLOE_METRICS"}
        r = subprocess.run([sys.executable, "-m", "broker.cli", "table", "status"],
                           capture_output=True, text=True, timeout=30, cwd=ROOT, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "no table topics"
        text = get("http://127.0.0.1:9644/metrics").decode()
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"floe_requests", "floe_wal_flushes", "floe_health_ok"} <= names
    finally:
        b.stop()
    r = subprocess.run([sys.executable, "-m", "broker.cli", "table", "status"],
                       capture_output=True, text=True, timeout=30, cwd=ROOT, env=env)
    assert r.returncode == 1 and "127.0.0.1:9644" in r.stderr


@pytest.mark.parametrize("interval_ms", ["100", "0"])
def test_memory_trim_interval_is_wired_into_the_broker(tmp_path: Path, interval_ms: str) -> None:
    """memory.trim.interval.ms (broker/memtrim.py): a broker started with it trims on that
    interval (counted in /metrics); 0 turns the trimmer off (no such series)."""
    from tests.brokerproc import running_broker

    with running_broker(tmp_path / "d", "--set", f"memory.trim.interval.ms={interval_ms}") as b:
        admin = b.admin_address()
        deadline = time.monotonic() + 10
        runs = 0.0
        if interval_ms == "0":
            time.sleep(0.5)  # a trimmer at 100 ms would have run by now
        while interval_ms != "0" and time.monotonic() < deadline:
            runs = total(scrape(admin), "floe_memory_trim_runs_total")
            if runs >= 3:
                break
            time.sleep(0.1)
        samples = scrape(admin)
    if interval_ms == "0":
        assert not any(n.startswith("floe_memory_trim") for n, _l in samples)
    else:
        assert runs >= 3
        assert any(n == "floe_memory_trim_seconds_total" for n, _l in samples)


@pytest.mark.parametrize("env", [{}, {"MALLOC_MMAP_THRESHOLD_": "1048576"}])
def test_the_broker_pins_the_malloc_mmap_threshold(tmp_path: Path, env: dict[str, str]) -> None:
    """broker/memtrim.py's malloc settings (and pyarrow on jemalloc) are applied
    by the broker itself at start (the peak RSS, issue 17), and an operator's
    MALLOC_MMAP_THRESHOLD_ is left to decide."""
    from broker.memtrim import ARROW_POOL, MMAP_THRESHOLD
    from tests.brokerproc import running_broker

    with running_broker(tmp_path / "d", **env) as b:
        b.admin_address()  # started
        log = b.log()
    line = next(ln for ln in log.splitlines() if "malloc:" in ln)
    if env:
        assert "mmap threshold as glibc or MALLOC_MMAP_THRESHOLD_ decide" in line, line
    else:
        assert f"mmap threshold {MMAP_THRESHOLD} bytes" in line, line
        assert f"pyarrow allocates with {ARROW_POOL}" in line, line
