"""What the s3stream engine (broker/storage.py) reports about itself, so that the composition
root wires health and metrics without knowing s3stream: its health checks (the object store and
the metadata database) and a Prometheus collector of its plain counters (WAL flushes, chunk
cache, object store requests, errors and retries), read at scrape time.

The families and their names are listed in README.md ("Metrics"); broker/metrics.py holds the
engine-agnostic ones (requests, groups, table topics, health).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.health import PROBE_KEY, HealthCheck
from broker.metrics import histogram_family
from s3stream.metadata import redact_url
from s3stream.objectstore import ObjectNotFoundError, ObjectStore, RetryingObjectStore
from s3stream.stats import ObjectStoreStats

if TYPE_CHECKING:
    from s3stream.log import LogStore


def health_checks(
    objects: ObjectStore,
    object_store_url: str,
    metadata_probe: Callable[[], Awaitable[object]],
    metadata_url: str,
) -> list[HealthCheck]:
    """Probes of the object store (an absent object: not-found proves it reachable and the
    credentials accepted; one attempt, no retries) with the errors of its own traffic, and of
    the metadata database (`metadata_probe`: a trivial query); see broker/health.py."""
    retrying = objects if isinstance(objects, RetryingObjectStore) else None
    backend = retrying.inner if retrying is not None else objects

    async def probe_objects() -> None:
        with contextlib.suppress(ObjectNotFoundError):
            await backend.get(PROBE_KEY)

    def traffic_error() -> tuple[str, float]:
        if retrying is None:
            return ("", 0.0)
        return (retrying.stats.last_error, retrying.stats.last_error_at)

    return [
        HealthCheck("object_store", redact_url(object_store_url), probe_objects, traffic_error),
        HealthCheck("metadata", redact_url(metadata_url), metadata_probe),
    ]


class StorageCollector(Collector):
    """The WAL, chunk cache and object store counters of one engine, at scrape time."""

    def __init__(self, log: LogStore, objects: ObjectStore) -> None:
        self.log = log
        self.objects = objects

    def collect(self) -> Iterator[Metric]:
        yield from self.wal_and_cache()
        if isinstance(self.objects, RetryingObjectStore):  # it counts every attempt
            yield from object_store_families(self.objects.stats)

    def wal_and_cache(self) -> Iterator[Metric]:
        log = self.log
        st = log.stats
        yield CounterMetricFamily("floe_wal_flushes", "WAL objects written and committed.",
                                  value=st.wal_flushes)
        yield CounterMetricFamily("floe_wal_commits",
                                  "Metadata transactions committing WAL objects: fewer than"
                                  " floe_wal_flushes when objects uploaded together commit"
                                  " together.", value=st.wal_commits)
        yield CounterMetricFamily("floe_wal_flush_failures",
                                  "WAL flushes that failed (their producers got an error).",
                                  value=st.wal_flush_failures)
        yield histogram_family("floe_wal_flush_bytes", "Record bytes per WAL flush.", [],
                               [([], st.wal_flush_bytes)])
        yield histogram_family("floe_wal_flush_latency_seconds",
                               "Time of one WAL flush: object PUT plus metadata commit.", [],
                               [([], st.wal_flush_seconds)])
        yield GaugeMetricFamily("floe_wal_unflushed_bytes",
                                "Bytes appended and not yet committed or failed.",
                                value=log.unflushed_bytes)
        yield CounterMetricFamily("floe_produce_room_waits",
                                  "Produce requests that waited for the WAL to commit what it"
                                  " held (more than (wal.max.inflight.flushes + 1) x"
                                  " wal.flush.max.bytes).", value=st.room_waits)
        yield CounterMetricFamily("floe_produce_room_wait_seconds",
                                  "Time Produce requests waited for room in the WAL.",
                                  value=st.room_wait_seconds)
        yield histogram_family("floe_metadata_queue_seconds",
                               "Wait of a metadata store call for the store's one thread"
                               " (0 for a call made on the event loop's thread).", [],
                               [([], log.meta.queue_seconds)])
        yield CounterMetricFamily("floe_metadata_calls_on_loop",
                                  "WAL commits and object id reservations tried on the event"
                                  " loop's thread (SQLite, the store's thread idle).",
                                  value=log.meta.ran_now)
        yield CounterMetricFamily("floe_metadata_calls_on_loop_busy",
                                  "Of those, the ones that found another connection's lock"
                                  " and went to the store's thread to wait for it.",
                                  value=log.meta.ran_now_busy)
        yield CounterMetricFamily("floe_cache_hits", "Chunk cache lookups that found the chunk.",
                                  value=log.cache.hits)
        yield CounterMetricFamily("floe_cache_misses", "Chunk cache lookups that missed.",
                                  value=log.cache.misses)
        yield GaugeMetricFamily("floe_cache_size_bytes", "Bytes held in the chunk cache.",
                                value=log.cache.size)
        looked = log.cache.hits + log.cache.misses
        yield GaugeMetricFamily("floe_cache_hit_ratio",
                                "Chunk cache hits / lookups since start (0 before any).",
                                value=log.cache.hits / looked if looked else 0.0)


def object_store_families(st: ObjectStoreStats) -> Iterator[Metric]:
    req = CounterMetricFamily("floe_object_store_requests",
                              "Object store requests (each attempt), by operation.",
                              labels=["op"])
    err = CounterMetricFamily("floe_object_store_errors",
                              "Object store requests that failed (not-found excluded).",
                              labels=["op"])
    for op, s in sorted(st.ops.items()):
        req.add_metric([op], s.requests)
        err.add_metric([op], s.errors)
    yield req
    yield err
    yield histogram_family("floe_object_store_latency_seconds",
                           "Time of one object store request, by operation.", ["op"],
                           [([op], s.seconds) for op, s in sorted(st.ops.items())])
    yield CounterMetricFamily("floe_object_store_retries",
                              "Object store requests repeated after a retriable error.",
                              value=st.retries)
