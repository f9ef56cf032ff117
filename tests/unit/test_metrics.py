"""broker/metrics.py and broker/health.py without a broker process: the collector turns the
storage layer's plain counters into Prometheus families (parsed back with prometheus_client's
own parser), and health probes report errors and recover."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.app import build_storage
from broker.config import load_settings
from broker.engine import StorageEngine
from broker.health import Health
from broker.metrics import BrokerMetrics, NetStats, Sources, api_name
from broker.nullstorage import NullStorage
from broker.storagemetrics import object_store_families
from s3stream.objectstore import (
    MemoryObjectStore,
    ObjectNotFoundError,
    RetryableError,
    RetryingObjectStore,
    RetryPolicy,
)
from s3stream.stats import Histogram
from tests.faults import FaultyStore
from tests.rawclient import make_batch


def samples(m: BrokerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (name, sorted labels)."""
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    h = Histogram((1.0, 2.0, 4.0))
    for v in (0.5, 1.0, 1.5, 3.0, 9.0):
        h.observe(v)
    assert h.cumulative() == [(1.0, 2), (2.0, 3), (4.0, 4), (float("inf"), 5)]
    assert h.count == 5 and h.sum == pytest.approx(15.0)


def test_request_counts_and_latency_by_api_name() -> None:
    net = NetStats()
    for _ in range(3):
        net.request(0, 9)
        net.answered(0, 0.002)
    net.request(18, 3)
    net.answered(18, 0.2)
    net.bytes_in, net.bytes_out = 1234, 56
    m = BrokerMetrics(Sources(net=net))
    got = samples(m)
    assert api_name(0) == "Produce" and api_name(18) == "ApiVersions"
    assert got[("floe_requests_total", (("api", "Produce"), ("version", "9")))] == 3
    assert got[("floe_requests_total", (("api", "ApiVersions"), ("version", "3")))] == 1
    assert got[("floe_request_latency_seconds_count", (("api", "Produce"),))] == 3
    le = (("api", "ApiVersions"), ("le", "0.1"))
    assert got[("floe_request_latency_seconds_bucket", le)] == 0  # 0.2 s is above 0.1
    le = (("api", "ApiVersions"), ("le", "0.25"))
    assert got[("floe_request_latency_seconds_bucket", le)] == 1
    assert got[("floe_network_bytes_in_total", ())] == 1234
    assert got[("floe_network_bytes_out_total", ())] == 56


def test_two_brokers_in_one_process_have_separate_registries() -> None:
    a, b = BrokerMetrics(), BrokerMetrics()
    a.net.request(3, 12)
    a.compacted(None, failed=True)
    assert samples(a)[("floe_requests_total", (("api", "Metadata"), ("version", "12")))] == 1
    assert ("floe_requests_total", (("api", "Metadata"), ("version", "12"))) not in samples(b)
    assert ("floe_compaction_runs_total", (("outcome", "error"),)) not in samples(b)
    assert samples(a)[("floe_compaction_runs_total", (("outcome", "error"),))] == 1


def test_object_store_requests_errors_retries_and_not_found() -> None:
    faulty = FaultyStore(MemoryObjectStore())
    faulty.fail_puts = 2
    store = RetryingObjectStore(faulty, RetryPolicy(base_delay=0.001, max_delay=0.002),
                                rand=lambda: 0.0)

    async def work() -> None:
        await store.put("a", b"x")  # two failed attempts, then one that works
        assert await store.get("a") == b"x"
        with pytest.raises(ObjectNotFoundError):
            await store.get("missing")  # an answer, not a fault

    asyncio.run(work())
    st = store.stats
    assert (st.ops["PUT"].requests, st.ops["PUT"].errors) == (3, 2)
    assert (st.ops["GET"].requests, st.ops["GET"].errors) == (2, 0)
    assert st.retries == 2 == store.retries
    assert "SlowDown" in st.last_error and st.last_error_at > 0

    got = _objects_only(BrokerMetrics(), store)
    assert got[("floe_object_store_requests_total", (("op", "PUT"),))] == 3
    assert got[("floe_object_store_errors_total", (("op", "PUT"),))] == 2
    assert got[("floe_object_store_retries_total", ())] == 2
    assert got[("floe_object_store_latency_seconds_count", (("op", "GET"),))] == 2


def _objects_only(
    m: BrokerMetrics, store: RetryingObjectStore
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in object_store_families(store.stats):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_engines_report_their_own_health_checks_and_metrics(tmp_path: Path) -> None:
    """The composition root wires what the engine hands it: the s3stream engine's checks
    (object store, metadata) and collector (WAL, cache, object store); the null engine's none."""
    settings = load_settings(
        {"data.dir": str(tmp_path), "object.store": "memory://", "wal.flush.interval.ms": "1"},
        None, environ={},
    )
    storage: StorageEngine = build_storage(settings)
    await storage.open()
    try:
        checks = storage.health_checks(settings)
        assert [(c.name, c.target) for c in checks] == [
            ("object_store", "memory://"), ("metadata", settings.metadata_url)
        ]
        h = Health()
        for c in checks:
            h.add_check(c)
        assert await h.check_all()
        await storage.create_topic("t", 1, {})
        await asyncio.wait_for(storage.append("t", 0, bytes(make_batch([b"v"]))), 10)
        m = BrokerMetrics(Sources(storage=storage, health=h))
        for collector in storage.collectors():
            m.register(collector)
        got = samples(m)
        assert got[("floe_wal_flushes_total", ())] >= 1
        # every metadata call (open, heartbeats, the flush's commit) counted; the flush's id
        # reservation and commit on the loop's thread unless a heartbeat had the store's
        # thread then (test_metadata_run_now: when they run where)
        assert got[("floe_metadata_queue_seconds_count", ())] >= 3
        on_loop = got[("floe_metadata_calls_on_loop_total", ())]
        assert 0 <= got[("floe_metadata_calls_on_loop_busy_total", ())] <= on_loop <= 2
        assert got[("floe_object_store_requests_total", (("op", "PUT"),))] >= 1
        assert got[("floe_topics", ())] == 1 and got[("floe_partitions", ())] == 1
        assert got[("floe_health_ok", (("component", "metadata"),))] == 1
    finally:
        await storage.close()
    null: StorageEngine = NullStorage()
    assert null.health_checks(settings) == [] and null.collectors() == []


def test_health_reports_the_last_error_and_recovers() -> None:
    state = {"fail": True}

    async def probe() -> None:
        if state["fail"]:
            raise RetryableError("connection refused")

    async def stuck() -> None:
        await asyncio.sleep(3600)

    async def work() -> None:
        h = Health()
        h.add("object_store", "s3://b/p?endpoint=http://127.0.0.1:1", probe)
        assert not await h.check_all()
        r = h.report()
        assert r["healthy"] is False
        c = r["components"]["object_store"]
        assert c["ok"] is False and "connection refused" in c["last_error"]
        state["fail"] = False
        assert await h.check_all()
        c = h.report()["components"]["object_store"]
        assert c["ok"] is True and "connection refused" in c["last_error"]  # kept, with time

    asyncio.run(work())

    async def timeout() -> None:
        import broker.health as health

        old, health.PROBE_TIMEOUT_S = health.PROBE_TIMEOUT_S, 0.05
        try:
            h = Health()
            h.add("catalog", "sqlite:///x", stuck)
            c = await h.check("catalog")
            assert not c.ok and "no answer within" in c.last_error
        finally:
            health.PROBE_TIMEOUT_S = old

    asyncio.run(timeout())


def test_table_topic_retries_by_reason() -> None:
    status = {
        "topic": "t", "table": "ns.t", "commits": 2, "rows": 9, "dead_letters": 0,
        "last_error": None, "last_commit": None,
        "retries": {"error": 4, "commit_conflict": 1}, "partitions": [],
    }
    got = samples(BrokerMetrics(Sources(tables=lambda: [status])))
    lv = (("table", "ns.t"), ("topic", "t"))  # labels sorted by name
    assert got[("floe_table_retries_total", (("reason", "error"), *lv))] == 4
    assert got[("floe_table_retries_total", (("reason", "commit_conflict"), *lv))] == 1
