"""Wires settings, storage and the network layer into a running broker."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from kio.index import load_entity_module
from kio.schema.index import api_key_map
from kio.static.constants import EntityType

from broker.admin import TableRoutes, serve_admin
from broker.brokers import Leases, brokers_report
from broker.cluster import ClusterSettings
from broker.cluster.coordinators import drop_moved
from broker.config import Settings, topic_defaults
from broker.engine import StorageEngine
from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import OffsetStore
from broker.handlers import BrokerContext
from broker.handlers.base import REGISTRY
from broker.health import Health
from broker.logcleaner import CleanerStats
from broker.memtrim import (
    ARENAS,
    ARROW_POOL,
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    MemoryTrimmer,
    arrow_pool,
    fix_mmap_threshold,
    fix_trim_threshold,
    limit_arenas,
    malloc_trim,
)
from broker.metadata.tablestate import TableStates
from broker.metadata.tablework import TableWork
from broker.metrics import BrokerMetrics, Sources
from broker.net import close_server, serve
from broker.nullstorage import NullStorage
from broker.schemaregistry.external import ExternalRegistry
from broker.schemaregistry.service import start_schema_registry
from broker.schemavalidation import SchemaValidator
from broker.storage import Storage
from broker.txn.coordinator import TxnCoordinator
from s3stream.compaction import CompactionStats
from s3stream.log import WalSettings
from s3stream.metadata import open_metadata_store, redact_url
from s3stream.objectstore import is_local_dir, open_object_store
from tabletopic import config as _table_configs  # noqa: F401  registers table.topic.*
from tabletopic.api import TableApi
from tabletopic.catalog import open_catalog
from tabletopic.manager import TableTopics
from tabletopic.ops import TableOps

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger("floe")
T = TypeVar("T")


# wal.max.inflight.flushes when not set: on S3 an upload takes tens of ms of waiting, so two
# go at once; on a local directory every upload is the broker's own CPU and disk (writes, two
# fsyncs), and at once they only got slower: fixed-1k-16p produce p99 63-84 ms with 1, 108-119
# with 2, 116-173 with 4; max-1k-16p 173-195 MiB/s with 1 against 171-180 with 4 (issue 17,
# runs alternated). On moto (2 vCPUs, quiet): fixed 10 MiB/s produce p99 201/224/236 ms with
# 4, 107/119/144 with 2, 76 with 1 (each upload slower the more go at once: 48 ms mean with
# 4, 30 with 2, 21 with 1, and commits waiting their turn); max-rate 12 s produce 1.18/1.26M
# records with 4, 1.21/1.12M with 2, 1.01/1.04M with 1.
INFLIGHT_FLUSHES_LOCAL, INFLIGHT_FLUSHES_REMOTE = 1, 2


def build_storage(settings: Settings) -> Storage:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    objects = open_object_store(settings.object_store_url)
    inflight = settings.wal_max_inflight_flushes
    if inflight is None:
        local = is_local_dir(settings.object_store_url)
        inflight = INFLIGHT_FLUSHES_LOCAL if local else INFLIGHT_FLUSHES_REMOTE
    wal = WalSettings(
        flush_interval_ms=settings.wal_flush_interval_ms,
        flush_max_bytes=settings.wal_flush_max_bytes,
        max_inflight_flushes=inflight,
        cache_max_bytes=settings.cache_max_bytes,
        readahead_bytes=settings.cache_readahead_bytes,
    )
    cluster = ClusterSettings(
        node_id=settings.node_id,
        rack=settings.broker_rack,
        heartbeat_interval_ms=settings.broker_heartbeat_interval_ms,
        session_timeout_ms=settings.broker_session_timeout_ms,
    )
    return Storage(
        objects,
        open_metadata_store(settings.metadata_url),
        wal,
        cluster,
        rack_aware=settings.replica_selector_class != "",
    )


async def _every(interval_ms: int, what: str, job: Callable[[], Awaitable[object]]) -> None:
    """Run a maintenance job forever; a failed run is logged and tried again next time."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            await job()
        except Exception:
            log.exception("%s failed; retrying in %d ms", what, interval_ms)


def _health(settings: Settings, storage: StorageEngine, catalog: Catalog) -> Health:
    """The engine's own checks (s3stream: object store and metadata database) and the catalog
    (its namespaces); see broker/health.py."""
    h = Health()
    for check in storage.health_checks(settings):
        h.add_check(check)
    h.add("catalog", redact_url(settings.catalog_url),
          lambda: asyncio.to_thread(catalog.list_namespaces))
    return h


async def _admin(
    settings: Settings,
    metrics: BrokerMetrics,
    health: Health,
    tables: Callable[[], object],
    routes: TableRoutes | None = None,
    brokers: Callable[[], object] = list,
) -> asyncio.Server | None:
    """The admin port (`metrics` setting): prints `metrics on HOST:PORT`. A port that cannot be
    bound is logged as an ERROR and the broker runs without it (Kafka clients do not need it)."""
    if settings.metrics is None:
        return None
    mhost, mport = settings.metrics
    try:
        server = await serve_admin(
            mhost, mport, metrics.exposition,
            lambda: {"health": health.report(), "tables": tables(), "brokers": brokers(),
                     **metrics.reports()},
            routes,
        )
    except OSError as e:
        log.error(
            "admin port %s (/metrics, /status) not served: %s", settings.values["metrics"], e
        )
        return None
    shost, sport = server.sockets[0].getsockname()[:2]
    print(f"metrics on {shost}:{sport}", flush=True)
    return server


def _counted(
    job: Callable[[], Awaitable[T]], record: Callable[[T | None, bool], None]
) -> Callable[[], Awaitable[T]]:
    """`job`, with its outcome and statistics handed to `record` (a metrics counter)."""

    async def run() -> T:
        try:
            stats = await job()
        except Exception:
            record(None, True)
            raise
        record(stats, False)
        return stats

    return run


def settle_heap() -> None:
    """Called once before the broker serves, so that no request pays for start-up work (the
    fixed-rate produce p99 regression of issue 17; benchmarks/README.md has the figures).

    - Loads the response schema module of every served version of every API (some 160 kio
      modules): kio loads them lazily, and broker.handlers.base reads every served version of
      an API's response classes the first time it answers that API, which stalled the event
      loop for 56-98 ms in the first Produce and again in the first Fetch.
    - Collects, then freezes what exists (gc.freeze): the imports (pyarrow, pyiceberg, kio's
      schema classes) are most of the heap, and a full collection walked all of it on the
      event loop, 80-240 ms (2 shared cores) every few seconds under produce load, the first
      one set off by those imports; frozen, a full collection walks only what the broker made
      since (2-30 ms). What is frozen is never collected: cycles start-up left behind stay (a
      fixed amount); objects freed by reference counting still go.

    Costs 0.5-0.8 s of start-up on 2 shared cores and ~10 MiB of RSS.
    """
    for key, served in REGISTRY.items():
        for version in range(served.min_version, served.max_version + 1):
            load_entity_module(api_key_map[key], version, EntityType.response)
    gc.collect()
    gc.freeze()


def is_null_engine(settings: Settings) -> bool:
    """`--object-store null://` selects the null storage engine (broker/nullstorage.py)."""
    return settings.object_store_url.startswith("null:")


async def _run_null_broker(settings: Settings, stop: asyncio.Event) -> None:
    """The same front end (network layer, handlers, group coordinator) on the null engine,
    which stores no record: no table topics, maintenance, health probes, metrics or schema
    registry, having nothing to act on. The benchmarks' protocol ceiling."""
    storage = NullStorage()
    storage.topic_defaults.update(topic_defaults(settings))
    await storage.open()
    host, port = settings.listen
    groups = GroupCoordinator(
        initial_delay_s=settings.group_initial_rebalance_delay_ms / 1000,
        min_session_s=settings.group_min_session_timeout_ms / 1000,
        max_session_s=settings.group_max_session_timeout_ms / 1000,
    )
    offsets = OffsetStore(storage.group_offsets)
    groups.start()
    ctx = BrokerContext(storage, settings, settings.node_id, host, port, groups, offsets)
    settle_heap()  # the protocol ceiling pays no start-up work either
    server = await serve(ctx, host, port, settings.socket_request_max_bytes)
    bound_host, bound_port = server.sockets[0].getsockname()[:2]
    ctx.host, ctx.port = settings.advertised or (bound_host, bound_port)
    log.warning("floe broker %d on the null engine: records are not stored", ctx.node_id)
    print(f"listening on {bound_host}:{bound_port}", flush=True)
    try:
        await stop.wait()
    finally:
        await close_server(server)
        await groups.stop()
        await storage.close()


def _memory_trimmer(settings: Settings, metrics: BrokerMetrics) -> list[asyncio.Task[None]]:
    """memory.trim.interval.ms (broker/memtrim.py): its task, counted in metrics; none when
    off or where the C library has no malloc_trim (the CLI refuses a value set there)."""
    trim = malloc_trim() if settings.memory_trim_interval_ms else None
    if trim is None:
        return []
    trimmer = MemoryTrimmer(settings.memory_trim_interval_ms, trim)
    metrics.register(trimmer)
    return [asyncio.create_task(trimmer.run(), name="memory-trim")]


def _recorder(metrics: BrokerMetrics, job: str) -> Callable[[object | None, bool], None]:
    """The metrics counter of an engine maintenance job (compaction, log cleaner; others
    are not counted)."""

    def record(stats: object | None, failed: bool) -> None:
        if job == "compaction":
            metrics.compacted(stats if isinstance(stats, CompactionStats) else None, failed)
        elif job == "log cleaner":
            metrics.cleaned(stats if isinstance(stats, CleanerStats) else None, failed)

    return record


async def run_broker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    arenas, pinned = limit_arenas(), fix_mmap_threshold()  # before the worker threads
    trim = fix_trim_threshold()
    chosen_pool = arrow_pool()
    log.info(
        "malloc: %s, %s, %s; %s (broker/memtrim.py)",
        f"{ARENAS} arenas" if arenas else "arenas as glibc or MALLOC_ARENA_MAX decide",
        f"mmap threshold {MMAP_THRESHOLD} bytes" if pinned
        else "mmap threshold as glibc or MALLOC_MMAP_THRESHOLD_ decide",
        f"trim threshold {TRIM_THRESHOLD} bytes" if trim
        else "trim threshold as glibc or MALLOC_TRIM_THRESHOLD_ decide",
        f"pyarrow allocates with {ARROW_POOL}" if chosen_pool
        else "pyarrow's pool as it or ARROW_DEFAULT_MEMORY_POOL decide",
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if is_null_engine(settings):
        await _run_null_broker(settings, stop)
        return
    storage = build_storage(settings)
    catalog = open_catalog(settings.catalog_url, settings.warehouse_url)  # a bad URL fails here
    storage.topic_defaults.update(topic_defaults(settings))
    # before the store opens: from then on this broker holds a lease that only the event loop
    # renews, and these 0.5-3 s (loaded machine) of work would let it lapse at once
    settle_heap()
    await storage.open()
    host, port = settings.listen
    groups = GroupCoordinator(
        initial_delay_s=settings.group_initial_rebalance_delay_ms / 1000,
        min_session_s=settings.group_min_session_timeout_ms / 1000,
        max_session_s=settings.group_max_session_timeout_ms / 1000,
    )
    offsets = OffsetStore(storage.group_offsets)
    await offsets.load()
    groups.start()
    # state in the metadata store; in a cluster, the ids placed on this broker
    txn = TxnCoordinator(storage, storage.kafka, offsets, node_id=settings.node_id)
    await txn.start()  # finishes transactions stopped between their markers
    ctx = BrokerContext(storage, settings, settings.node_id, host, port, groups, offsets)
    ctx.txn = txn
    ctx.table_work = TableWork(storage.meta)  # table topics' workers, commits and progress
    await ctx.table_work.open()
    # groups whose coordinator moved elsewhere are unloaded at once, at every heartbeat
    storage.cluster.listeners.append(lambda v: drop_moved(groups, v, settings.node_id))
    drop_moved(groups, storage.cluster.view, settings.node_id)
    # produce awaits it before appending to a topic with schema validation on; it holds the
    # produce until the registry below is attached (None when off: such produces then fail)
    ctx.schemas = SchemaValidator()
    metrics = BrokerMetrics(Sources(storage=storage, groups=groups, offsets=offsets))
    for collector in storage.collectors():  # the engine's own counters (WAL, cache, objects)
        metrics.register(collector)
    health = _health(settings, storage, catalog)
    external = None  # schema.registry.url: validation and table topics read it instead
    if settings.schema_registry_url:
        external = ExternalRegistry(settings.schema_registry_url)
        health.add("schema_registry", external.url, external.probe, external.last_error)
    metrics.sources.health = health
    await health.check_all()  # an unreachable store is logged (ERROR) before `listening on`
    server = await serve(ctx, host, port, settings.socket_request_max_bytes, metrics.net)
    bound_host, bound_port = server.sockets[0].getsockname()[:2]
    if settings.advertised is not None:
        ctx.host, ctx.port = settings.advertised
    else:
        ctx.host = bound_host if bound_host not in ("0.0.0.0", "::") else socket.getfqdn()
        ctx.port = bound_port
    await storage.advertise(ctx.host, ctx.port)  # other brokers' Metadata lists it now
    log.info(
        "floe broker %d: objects %s, metadata %s, cluster %s, advertised %s:%d",
        ctx.node_id,
        settings.object_store_url,
        redact_url(settings.metadata_url),
        storage.cluster_id,
        ctx.host,
        ctx.port,
    )
    print(f"listening on {bound_host}:{bound_port}", flush=True)
    tables = TableTopics(
        storage,
        catalog,
        orphan_min_age_s=settings.table_orphan_min_age_ms / 1000,
        node_id=settings.node_id,
    )
    metrics.sources.tables = tables.status
    tables.states = TableStates(storage.meta)  # operators' pauses (floe table pause)
    tables.work = ctx.table_work
    await tables.states.open()
    api = TableApi(TableOps(storage, catalog, tables, tables.states))
    leases = Leases(storage.meta)  # every broker's lease expiry, for /status and the console
    status_server = await _admin(
        settings, metrics, health, tables.status, api.handle,
        lambda: brokers_report(ctx.node_id, ctx.host, ctx.port, storage.cluster_view(),
                               leases.expires_ms))
    registry, registry_server = await start_schema_registry(settings, storage.meta)
    source = external if external is not None else registry
    ctx.schemas.attach(source)
    tables.schemas = source  # by_schema_id table topics fetch writer schemas from it
    background = [
        asyncio.create_task(tables.run(), name="table-topics"),
        *_memory_trimmer(settings, metrics),
        asyncio.create_task(health.run(), name="health"),
        asyncio.create_task(leases.run(), name="broker-leases"),
    ]
    # the engine's own maintenance (compaction, retention, log cleaner), counted in metrics
    for job in storage.maintenance_jobs(settings):
        run = _counted(job.run, _recorder(metrics, job.name))
        background.append(
            asyncio.create_task(_every(job.interval_ms, job.name, run), name=job.name)
        )
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if status_server is not None:
            status_server.close()
        if registry_server is not None:
            registry_server.close()
        await close_server(server)
        await txn.stop()
        await groups.stop()
        await storage.close()
