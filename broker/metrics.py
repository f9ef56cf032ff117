"""Broker-wide Prometheus metrics, in a registry of their own (not prometheus_client's global
one, so several brokers can run in one process).

The hot paths (requests in net.py, WAL flushes in s3stream/wal.py, cache lookups in
s3stream/reader.py, object store calls in s3stream/objectstore.py) only bump plain counters
(`NetStats` here, `s3stream.stats`); `FloeCollector` turns the broker's into metric families
when /metrics is scraped, and each storage engine hands the composition root collectors of its
own (`StorageEngine.collectors()`; the s3stream engine's: broker/storagemetrics.py), which
`BrokerMetrics.register` adds to the same registry.
Group lag and table-topic figures are computed at scrape time from the broker's in-memory
state (nothing here awaits, so no state is read across an await). Maintenance jobs, which are
rare, update ordinary prometheus_client counters.

Every metric, its type, labels and meaning: the "Metrics" table in README.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from s3stream.stats import LATENCY_BUCKETS, Histogram

if TYPE_CHECKING:
    from broker.engine import StorageEngine
    from broker.groups.coordinator import GroupCoordinator
    from broker.groups.offsets import OffsetStore
    from broker.health import Health
    from broker.logcleaner import CleanerStats
    from s3stream.compaction import CompactionStats


@dataclass
class NetStats:
    """What the network layer counts: plain ints and dicts, bumped once per request."""

    bytes_in: int = 0
    bytes_out: int = 0
    connections_opened: int = 0
    connections_closed: int = 0
    connections_dropped: int = 0  # closed by the broker because of a bad or failed request
    requests: dict[tuple[int, int], int] = field(default_factory=dict)  # (api key, version)
    latency: dict[int, Histogram] = field(default_factory=dict)  # api key -> seconds

    def request(self, api_key: int, version: int) -> None:
        k = (api_key, version)
        self.requests[k] = self.requests.get(k, 0) + 1

    def answered(self, api_key: int, seconds: float) -> None:
        h = self.latency.get(api_key)
        if h is None:
            h = self.latency[api_key] = Histogram(LATENCY_BUCKETS)
        h.observe(seconds)


@cache
def api_name(api_key: int) -> str:
    """Kafka's name of an API ("Produce", "Fetch", ...), from its schema class."""
    from broker.protocol.codec import response_type

    try:
        return response_type(api_key, 0).__name__.removesuffix("Response")
    except Exception:
        try:
            from broker.handlers import REGISTRY

            v = REGISTRY[api_key].min_version
            return response_type(api_key, v).__name__.removesuffix("Response")
        except Exception:
            return f"api{api_key}"


def histogram_family(
    name: str, doc: str, label_names: list[str], series: list[tuple[list[str], Histogram]]
) -> HistogramMetricFamily:
    """One histogram family with a series per label values."""
    fam = HistogramMetricFamily(name, doc, labels=label_names)
    for values, h in series:
        buckets = [("+Inf" if b == float("inf") else repr(b), n) for b, n in h.cumulative()]
        fam.add_metric(values, buckets, h.sum)
    return fam


@dataclass
class Sources:
    """What the collector reads; each part may be absent (unit tests, partial start-up)."""

    net: NetStats | None = None
    storage: StorageEngine | None = None  # topics and offsets (group lag, counts)
    groups: GroupCoordinator | None = None
    offsets: OffsetStore | None = None
    tables: Callable[[], list[dict[str, Any]]] | None = None
    health: Health | None = None


class FloeCollector(Collector):
    """Reads the plain counters and in-memory state of one broker at scrape time."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        s = self.sources
        if s.net is not None:
            yield from self._net(s.net)
        if s.storage is not None:
            yield from self._topics(s.storage)
        if s.groups is not None and s.offsets is not None and s.storage is not None:
            yield from self._groups(s.groups, s.offsets, s.storage)
        if s.tables is not None:
            yield from self._tables(s.tables())
        if s.health is not None:
            up = GaugeMetricFamily(
                "floe_health_ok", "1 if the component's last check succeeded, else 0.",
                labels=["component"],
            )
            for name, c in s.health.components().items():
                up.add_metric([name], 1.0 if c.ok else 0.0)
            yield up

    # -- network ---------------------------------------------------------------------------
    def _net(self, n: NetStats) -> Iterator[Metric]:
        req = CounterMetricFamily(
            "floe_requests", "Requests received, by API and version.",
            labels=["api", "version"],
        )
        for (key, ver), count in sorted(n.requests.items()):
            req.add_metric([api_name(key), str(ver)], count)
        yield req
        yield histogram_family(
            "floe_request_latency_seconds",
            "Time from a request's decoding to its response being written, by API.",
            ["api"], [([api_name(k)], h) for k, h in sorted(n.latency.items())],
        )
        yield CounterMetricFamily("floe_network_bytes_in", "Request bytes received.",
                                  value=n.bytes_in)
        yield CounterMetricFamily("floe_network_bytes_out", "Response bytes sent.",
                                  value=n.bytes_out)
        yield CounterMetricFamily("floe_connections_opened", "Client connections accepted.",
                                  value=n.connections_opened)
        yield CounterMetricFamily("floe_connections_closed", "Client connections ended.",
                                  value=n.connections_closed)
        yield CounterMetricFamily(
            "floe_connections_dropped",
            "Connections the broker closed because a request was bad or failed.",
            value=n.connections_dropped,
        )
        yield GaugeMetricFamily("floe_connections", "Open client connections.",
                                value=n.connections_opened - n.connections_closed)

    # -- storage ---------------------------------------------------------------------------
    def _topics(self, storage: StorageEngine) -> Iterator[Metric]:
        """Engine-agnostic counts; each engine adds its own families (`collectors()`)."""
        yield GaugeMetricFamily("floe_topics", "Topics.", value=len(storage.topics))
        yield GaugeMetricFamily("floe_partitions", "Partitions of all topics.",
                                value=sum(len(t.streams) for t in storage.topics.values()))

    # -- groups ----------------------------------------------------------------------------
    def _groups(
        self, groups: GroupCoordinator, offsets: OffsetStore, storage: StorageEngine
    ) -> Iterator[Metric]:
        members = GaugeMetricFamily("floe_group_members", "Members of a consumer group.",
                                    labels=["group"])
        gen = GaugeMetricFamily("floe_group_generation", "Generation of a consumer group.",
                                labels=["group"])
        for gid, g in sorted(groups.groups.items()):
            members.add_metric([gid], len(g.members))
            gen.add_metric([gid], g.generation)
        yield members
        yield gen
        lag = GaugeMetricFamily(
            "floe_group_lag_records",
            "Log end offset minus the group's committed offset, per partition.",
            labels=["group", "topic", "partition"],
        )
        committed = GaugeMetricFamily("floe_group_committed_offset",
                                      "The group's committed offset, per partition.",
                                      labels=["group", "topic", "partition"])
        for gid, parts in sorted(offsets.offsets.items()):
            for (topic, p), row in sorted(parts.items()):
                try:
                    _start, end = storage.offsets(topic, p)
                except Exception:  # topic deleted or partition gone meanwhile
                    continue
                labels = [gid, topic, str(p)]
                committed.add_metric(labels, row.committed_offset)
                lag.add_metric(labels, max(0, end - row.committed_offset))
        yield lag
        yield committed

    # -- table topics ----------------------------------------------------------------------
    def _tables(self, tables: list[dict[str, Any]]) -> Iterator[Metric]:
        tl = ["topic", "table"]
        pl = [*tl, "partition"]
        fams: dict[str, Any] = {
            "commits": CounterMetricFamily("floe_table_commits", "Iceberg commits made.",
                                           labels=tl),
            "rows": CounterMetricFamily("floe_table_rows", "Rows committed to the table.",
                                        labels=tl),
            "dead": CounterMetricFamily("floe_table_dead_letters",
                                        "Records sent to the dead-letter topic.", labels=tl),
            "error": GaugeMetricFamily("floe_table_error", "1 while the last attempt failed.",
                                       labels=tl),
            "retries": CounterMetricFamily(
                "floe_table_retries",
                "Writer steps retried after an error (reason=error) and commits rebuilt after "
                "losing a race to a non-floe commit (reason=commit_conflict).",
                labels=[*tl, "reason"]),
            "last": GaugeMetricFamily("floe_table_last_commit_timestamp_seconds",
                                      "Time of the last commit.", labels=tl),
            "age": GaugeMetricFamily("floe_table_last_commit_age_seconds",
                                     "Seconds since the last commit.", labels=tl),
            "lag_r": GaugeMetricFamily("floe_table_lag_records",
                                       "Records in the log not yet committed to the table.",
                                       labels=pl),
            "lag_s": GaugeMetricFamily("floe_table_lag_seconds",
                                       "Age of the oldest record not yet in the table.",
                                       labels=pl),
            "conv_s": GaugeMetricFamily(
                "floe_table_convert_lag_seconds",
                "Age of the oldest acknowledged record the writer has not converted yet.",
                labels=pl),
            "commit_s": GaugeMetricFamily(
                "floe_table_last_commit_duration_seconds",
                "Time the last commit took: Parquet written plus catalog commit.", labels=tl),
            "co": GaugeMetricFamily("floe_table_committed_offset",
                                    "Next offset the table holds.", labels=pl),
            "end": GaugeMetricFamily("floe_table_log_end_offset",
                                     "Log end offset (high watermark).", labels=pl),
            "io_req": CounterMetricFamily(
                "floe_table_object_store_requests",
                "Warehouse requests of the table's files by the broker (PUT: files written, "
                "GET: files read, DELETE, LIST: orphan listings).", labels=[*tl, "op"]),
            "io_bytes": CounterMetricFamily(
                "floe_table_object_store_bytes",
                "Bytes of the table's files written (PUT) or read (GET) by the broker.",
                labels=[*tl, "op"]),
            "writer": GaugeMetricFamily(
                "floe_table_partition_writer",
                "1 for each partition of a table topic this broker writes (its leader's worker).",
                labels=[*pl, "node"]),
            "coord": GaugeMetricFamily(
                "floe_table_coordinator",
                "1 while this broker is the table's commit coordinator (leads partition 0).",
                labels=[*tl, "node"]),
            "info": InfoMetricFamily("floe_table_last_error",
                                     "The last error of a table topic's writer (while failing).",
                                     labels=tl),
        }
        now = time.time()
        for t in tables:
            lv = [t["topic"], t["table"]]
            fams["commits"].add_metric(lv, t["commits"])
            fams["rows"].add_metric(lv, t["rows"])
            fams["dead"].add_metric(lv, t["dead_letters"])
            fams["error"].add_metric(lv, 1 if t["last_error"] else 0)
            for reason, n in sorted(t.get("retries", {}).items()):
                fams["retries"].add_metric([*lv, reason], n)
            if t["last_error"]:
                fams["info"].add_metric(lv, {"error": str(t["last_error"])[:300]})
            for op, c in t.get("costs", {}).items():
                fams["io_req"].add_metric([*lv, op], c["requests"])
                fams["io_bytes"].add_metric([*lv, op], c["bytes"])
            fresh = t.get("freshness", {})
            if fresh.get("last_commit_seconds") is not None:
                fams["commit_s"].add_metric(lv, fresh["last_commit_seconds"])
            for f in fresh.get("partitions", []):
                fams["conv_s"].add_metric([*lv, str(f["partition"])],
                                          f["ack_to_converted_seconds"])
            if t["last_commit"] is not None:
                fams["last"].add_metric(lv, t["last_commit"])
                fams["age"].add_metric(lv, max(0.0, now - t["last_commit"]))
            node = str(t.get("node_id", 0))
            coordinator = t.get("coordinator", {})
            fams["coord"].add_metric([*lv, node], 1 if coordinator.get("active") else 0)
            for p in t["partitions"]:
                v = [*lv, str(p["partition"])]
                fams["writer"].add_metric([*v, node], 1)
                fams["lag_r"].add_metric(v, p["lag_records"])
                fams["lag_s"].add_metric(v, p["lag_seconds"])
                fams["co"].add_metric(v, p["committed_offset"])
                fams["end"].add_metric(v, p["log_end_offset"])
        yield from fams.values()


@runtime_checkable
class Reporting(Protocol):
    """A collector that also has parts of the /status document."""

    def report(self) -> dict[str, Any]: ...


class BrokerMetrics:
    """The registry of one broker: the scrape-time collector plus counters of maintenance."""

    def __init__(self, sources: Sources | None = None) -> None:
        self.sources = sources or Sources()
        self.net = self.sources.net or NetStats()
        self.sources.net = self.net
        # process-wide: no `_created` series (floe never uses them)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        self._reporting: list[Reporting] = []
        self.registry.register(FloeCollector(self.sources))
        r = self.registry
        self.compaction_runs = Counter("floe_compaction_runs", "Compaction runs, by outcome.",
                                       ["outcome"], registry=r)
        self.compaction_objects = Counter(
            "floe_compaction_objects",
            "Objects handled by compaction: kind=wal_read, stream_written, deleted.",
            ["kind"], registry=r)
        self.compaction_bytes = Counter("floe_compaction_bytes",
                                        "Bytes rewritten into stream objects.", registry=r)
        self.cleaner_runs = Counter("floe_log_cleaner_runs", "Log cleaner passes, by outcome.",
                                    ["outcome"], registry=r)
        self.cleaner_streams = Counter("floe_log_cleaner_partitions_cleaned",
                                       "Partitions cleaned by the log cleaner.", registry=r)
        self.cleaner_records = Counter("floe_log_cleaner_records_removed",
                                       "Records removed by the log cleaner.", registry=r)
        self.cleaner_bytes = Counter("floe_log_cleaner_bytes",
                                     "Bytes cleaned: phase=before, after, read.", ["phase"],
                                     registry=r)

    def compacted(self, stats: CompactionStats | None, failed: bool = False) -> None:
        self.compaction_runs.labels("error" if failed else "ok").inc()
        if stats is not None:
            self.compaction_objects.labels("wal_read").inc(stats.wal_objects)
            self.compaction_objects.labels("stream_written").inc(stats.stream_objects)
            self.compaction_objects.labels("deleted").inc(stats.deleted_objects)
            self.compaction_bytes.inc(stats.bytes)

    def cleaned(self, stats: CleanerStats | None, failed: bool = False) -> None:
        self.cleaner_runs.labels("error" if failed else "ok").inc()
        if stats is not None:
            self.cleaner_streams.inc(stats.streams_cleaned)
            self.cleaner_records.inc(stats.records_removed)
            self.cleaner_bytes.labels("before").inc(stats.bytes_before)
            self.cleaner_bytes.labels("after").inc(stats.bytes_after)
            self.cleaner_bytes.labels("read").inc(stats.bytes_read)

    def register(self, collector: Collector) -> None:
        """Add a collector of someone else's counters (a storage engine's `collectors()`)."""
        self.registry.register(collector)
        if isinstance(collector, Reporting):
            self._reporting.append(collector)

    def reports(self) -> dict[str, Any]:
        """The /status parts of the registered collectors that have one (`report()`: e.g. the
        s3stream engine's `costs` and `topics`, broker/costs.py)."""
        out: dict[str, Any] = {}
        for c in self._reporting:
            out.update(c.report())
        return out

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric, now."""
        return generate_latest(self.registry)
