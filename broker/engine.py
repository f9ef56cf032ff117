"""The storage seam: the Kafka-level interface every storage engine offers.

Handlers, DeleteRecords, table topics and the composition root reach the log only through
`StorageEngine` (an import contract in pyproject.toml keeps it so); which engine sits behind
it is chosen by the object-store URL in the composition root (`broker.app.run_broker`):

- `broker.storage.Storage`: the s3stream engine (`file://`, `s3://`, `memory://` objects,
  metadata in SQL). Its maintenance (compaction, retention, the log cleaner) is internal: it
  hands the composition root its jobs (`maintenance_jobs`), it exposes no chunk or stream.
- `broker.nullstorage.NullStorage` (`null://`): acknowledges without storing record bytes,
  keeps topics and offsets in memory; the benchmarks' protocol ceiling.

Contract of every engine (tests/unit/test_storage_scenarios.py runs it over each one):
- `append` is synchronous up to its durability wait, so appends made in order get offsets in
  that order; its future resolves once the batch is as durable as the engine makes anything
  (for `null://`: at once), with the batch's base offset.
- Errors a client should see are `KafkaError`s with the Kafka error code.
- `offsets` is (log start offset, high watermark); `read` serves whole batches from the one
  holding `offset`, raising OFFSET_OUT_OF_RANGE outside [log start, high watermark].
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.registry import Collector

from broker.cluster.model import ClusterView
from broker.config import ConfigError, Settings, TopicConfig, validate_topic_configs
from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import GroupOffsetBackend
from broker.health import HealthCheck
from broker.protocol.records import Buffer
from broker.protocol.recordset import RecordSet

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


def check_topic_name(name: str) -> None:
    if not name or name in (".", "..") or len(name) > MAX_TOPIC_NAME:
        raise KafkaError(ErrorCode.invalid_topic_exception, f"illegal topic name {name!r}")
    if not _LEGAL_TOPIC.match(name):
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_', '-'",
        )


class Topic:
    """A topic: its partitions' ids inside the engine and its configs, parsed once into a typed
    `config` whenever they are set (created, altered, loaded), so that produce, fetch,
    retention and the log cleaner never parse a string. Assigning `configs` (or the broker
    `defaults`) parses them again."""

    def __init__(
        self,
        name: str,
        topic_id: uuid.UUID,
        configs: Mapping[str, str],
        streams: list[int] | None = None,
        defaults: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.topic_id = topic_id
        self.streams: list[int] = [] if streams is None else streams  # engine id per partition
        # broker settings that are topic config defaults (config.topic_defaults)
        self._defaults: Mapping[str, str] = {} if defaults is None else defaults
        self.config = TopicConfig.parse(configs, self._defaults)

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, {self.topic_id}, {dict(self.config.raw)!r})"

    @property
    def configs(self) -> dict[str, str]:
        """The configs set on the topic (a copy)."""
        return dict(self.config.raw)

    @configs.setter
    def configs(self, configs: Mapping[str, str]) -> None:
        self.config = TopicConfig.parse(configs, self._defaults)

    @property
    def defaults(self) -> Mapping[str, str]:
        return self._defaults

    @defaults.setter
    def defaults(self, defaults: Mapping[str, str]) -> None:
        self._defaults = defaults
        self.config = TopicConfig.parse(self.config.raw, defaults)

    @property
    def partitions(self) -> int:
        return len(self.streams)


class TopicChanges:
    """A count of the changes to the topics this broker knows (created, deleted, configs
    changed, here or seen from the metadata database), and a wait for the next one: the
    table topics' manager applies `table.topic.*` settings at once instead of at its next
    poll."""

    def __init__(self) -> None:
        self.count = 0
        self._next: asyncio.Event | None = None

    def bump(self) -> None:
        self.count += 1
        if self._next is not None:
            self._next.set()
            self._next = None

    async def wait_past(self, seen: int, timeout_s: float) -> None:
        """Until the count is past `seen`, for at most `timeout_s`."""
        if self.count != seen:
            return
        if self._next is None:
            self._next = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._next.wait(), timeout_s)


class TopicTable:
    """Topics by name and by id, and the lookups and checks every engine makes the same way
    (engines keep their own partition state behind `Topic.streams`)."""

    def __init__(self) -> None:
        self.topics: dict[str, Topic] = {}
        self.topics_by_id: dict[uuid.UUID, Topic] = {}
        self.changes = TopicChanges()  # bumped by each engine's topic changes

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        return t

    def stream_id(self, topic: str, partition: int) -> int:
        t = self.topic(topic)
        if not 0 <= partition < len(t.streams):
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"topic {topic!r} has no partition {partition}",
            )
        return t.streams[partition]

    def check_new_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> dict[str, str]:
        """The topic's valid configs, or the Kafka error CreateTopics answers."""
        check_topic_name(name)
        if name in self.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        if partitions <= 0:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"number of partitions must be positive, got {partitions}",
            )
        return self.valid_configs(configs)

    @staticmethod
    def valid_configs(configs: dict[str, str | None] | dict[str, str]) -> dict[str, str]:
        """Topic configs checked like Kafka's, or INVALID_CONFIG naming the key."""
        try:
            return validate_topic_configs(configs)
        except ConfigError as e:
            raise KafkaError(ErrorCode.invalid_config, str(e)) from None


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_append_time: int  # -1 for CreateTime topics


@dataclass(frozen=True, slots=True)
class ReplicaRead:
    """What a read replica serves for one partition of a fetch, from one snapshot of the
    metadata database: records, log start and high watermark (also the last stable offset:
    a replica serves read_committed only for partitions without transactions)."""

    data: RecordSet
    log_start: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class MaintenanceJob:
    """A job the composition root runs every `interval_ms` (a failed run is retried then)."""

    name: str
    interval_ms: int
    run: Callable[[], Awaitable[object]]


class StorageEngine(Protocol):
    """What handlers, table topics and the composition root may ask of storage."""

    cluster_id: str
    topics: dict[str, Topic]  # read-only for callers: change topics through the methods
    topics_by_id: dict[uuid.UUID, Topic]
    topic_defaults: dict[str, str]  # broker settings that are topic config defaults
    changes: TopicChanges  # topics created, deleted, reconfigured (broker.engine.TopicTable)
    group_offsets: GroupOffsetBackend  # where committed consumer-group offsets are kept

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def maintenance_jobs(self, settings: Settings) -> list[MaintenanceJob]:
        """The engine's background work (compaction, retention, cleaning), for the root."""
        ...

    def health_checks(self, settings: Settings) -> list[HealthCheck]:
        """Probes of what the engine depends on (object store, metadata database), which the
        root adds to /status and floe_health_ok; none for an engine that depends on nothing."""
        ...

    def collectors(self) -> list[Collector]:
        """Prometheus collectors of the engine's own counters, read at scrape time."""
        ...

    def cluster_view(self) -> ClusterView | None:
        """The live brokers and each partition's leader and leader epoch, when brokers share
        the engine's storage; None: this broker alone leads every partition."""
        ...

    def led_epoch(self, topic: str, partition: int) -> int | None:
        """The leader epoch at which this broker serves the partition now; None when it does
        not (another broker leads it, or this broker's lease lapsed)."""
        ...

    # -- topics
    def topic(self, name: str) -> Topic:
        """The topic, or UNKNOWN_TOPIC_OR_PARTITION."""
        ...

    def stream_id(self, topic: str, partition: int) -> int:
        """The partition's id inside the engine, or UNKNOWN_TOPIC_OR_PARTITION."""
        ...

    def check_new_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> dict[str, str]: ...

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> Topic: ...

    async def delete_topic(self, name: str) -> None: ...

    async def create_partitions(self, name: str, total: int, validate_only: bool) -> None: ...

    async def set_topic_configs(
        self, name: str, configs: dict[str, str], validate_only: bool
    ) -> None: ...

    # -- partition reassignments (leadership only: broker.cluster.assignment's pins)
    async def reassign_partitions(
        self, changes: list[tuple[str, int, int | None]]
    ) -> list[KafkaError | None]:
        """Pin each (topic, partition) to a broker (None: cancel its pin); for each change
        its refusal (UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT: no such broker,
        NO_REASSIGNMENT_IN_PROGRESS: nothing to cancel) or None."""
        ...

    async def pinned_partitions(self) -> list[tuple[str, int, int, int]]:
        """(topic, partition, leader now, broker pinned to) of every pinned partition."""
        ...

    # -- produce
    async def room(self) -> None:
        """Wait while the engine holds as much produced data not yet durable as it may (a
        producer faster than the store waits for it); the Produce handler awaits it before
        appending, so the connection reads no further request meanwhile."""
        ...

    def append(
        self, topic: str, partition: int, data: Buffer | None
    ) -> asyncio.Future[AppendResult]:
        """A writable `data` (a view into the request's frame, which the network layer owns)
        may be changed in place: the batches' base offsets are written into it."""
        ...

    async def init_producer_id(self, producer_id: int, epoch: int) -> tuple[int, int]: ...

    # -- transactions (broker.txn)
    def append_marker(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool,
        coordinator_epoch: int,
    ) -> asyncio.Future[AppendResult]:
        """Append a transaction's COMMIT / ABORT control batch; resolves once durable, when
        the partition's transaction of that producer is closed."""
        ...

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """The first offset of the earliest open transaction, else the high watermark."""
        ...

    def aborted_transactions(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions with records in
        [start, end)."""
        ...

    # -- offsets and reads
    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, high watermark)."""
        ...

    def log_position(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[int, int] | None:
        """Where in the shared log a read of `max_bytes` from `offset` would go to the object
        store (the first and last WAL object ids of its chunks: they grow with write time);
        None when it would not (answered from memory, a stream object, nothing to read, or
        an engine without a shared log). Fetch keeps its partitions' reads together by it."""
        ...

    async def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> bytes:
        """`read_records`, joined (readers that decode the batches)."""
        ...

    async def read_records(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> RecordSet:
        """Whole batches from the one holding `offset`, within max_bytes (at least one if
        must_return_one), as views (what Fetch serves). OFFSET_OUT_OF_RANGE outside
        [log start, high watermark]."""
        ...

    async def offset_for_time(
        self, topic: str, partition: int, timestamp: int
    ) -> tuple[int, int] | None: ...

    async def wait_for_data(self, keys: list[tuple[str, int]], timeout: float) -> None: ...

    # -- read replicas (KIP-392: fetch from the closest replica; see broker.replicas)
    def preferred_read_replica(
        self, topic: str, partition: int, rack: str, committed: bool
    ) -> int:
        """For a partition this broker leads, the node id of the live broker a consumer in
        `rack` should fetch it from (another broker of that rack); -1: this one."""
        ...

    async def replica_read(
        self, topic: str, partition: int, offset: int, max_bytes: int, committed: bool
    ) -> ReplicaRead:
        """A read-only read of a partition another broker leads, of committed data (at least
        one batch); NOT_LEADER_OR_FOLLOWER when this broker cannot serve it so (the client
        goes back to the leader), OFFSET_OUT_OF_RANGE outside what the replica holds."""
        ...

    def commit_time(self, topic: str, partition: int, offset: int) -> float | None:
        """When `offset` became durable (epoch seconds), if the engine still knows."""
        ...

    # -- log start
    async def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Move the log start to `offset` (-1: the high watermark); returns the new log start.
        OFFSET_OUT_OF_RANGE beyond the high watermark."""
        ...

    async def apply_retention(self) -> int:
        """One retention pass over every topic; returns how many partitions moved."""
        ...

