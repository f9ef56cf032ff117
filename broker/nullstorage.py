"""The null storage engine (`--object-store null://`): acknowledges without storing.

Like Tansu's `null` engine it measures the front end alone (network, decoding, handlers):
topics, partitions, configs and each partition's offsets live in memory, so clients can
create topics, produce (every batch is acknowledged at once with the next offsets) and ask
Metadata or ListOffsets; no record byte is kept, so Fetch returns no records. Nothing
survives the process. The benchmarks' protocol ceiling is `floe broker` on this engine.

Checks made: the topic and partition exist, the record set is not empty and is made of whole
v2 batch headers (their record counts move the offsets). Not made: CRCs, topic-config
policies, idempotent sequences (no producer state is kept).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

from prometheus_client.registry import Collector

from broker.cluster.model import ClusterView
from broker.config import Settings
from broker.engine import (
    AppendResult,
    MaintenanceJob,
    ReplicaRead,
    StorageEngine,
    Topic,
    TopicTable,
)
from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import GroupOffsetBackend, MemoryGroupOffsets
from broker.health import HealthCheck
from broker.protocol.records import Buffer, CorruptBatchError, iter_headers
from broker.protocol.recordset import EMPTY, RecordSet


class NullStorage(TopicTable):
    """`broker.engine.StorageEngine` keeping offsets, not records."""

    def __init__(self) -> None:
        super().__init__()
        self.cluster_id = f"null-{uuid.uuid4().hex[:12]}"
        self.topic_defaults: dict[str, str] = {}
        self.group_offsets: GroupOffsetBackend = MemoryGroupOffsets()
        self._stream_ids = itertools.count()
        # stream id -> [log start offset, next offset]
        self._offsets: dict[int, list[int]] = {}
        self._producer_ids = itertools.count()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def maintenance_jobs(self, settings: Settings) -> list[MaintenanceJob]:
        return []

    def health_checks(self, settings: Settings) -> list[HealthCheck]:
        return []  # depends on nothing

    def collectors(self) -> list[Collector]:
        return []  # counts nothing of its own

    def cluster_view(self) -> ClusterView | None:
        return None  # nothing shared: this broker leads every partition

    def led_epoch(self, topic: str, partition: int) -> int | None:
        self.stream_id(topic, partition)  # UNKNOWN_TOPIC_OR_PARTITION if there is none
        return 0

    # -- topics ----------------------------------------------------------------------------
    def _add_partitions(self, t: Topic, count: int) -> None:
        for _ in range(count):
            sid = next(self._stream_ids)
            self._offsets[sid] = [0, 0]
            t.streams.append(sid)

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> Topic:
        valid = self.check_new_topic(name, partitions, configs)
        t = Topic(name, uuid.uuid4(), valid, defaults=self.topic_defaults)
        self._add_partitions(t, partitions)
        self.topics[name] = t
        self.topics_by_id[t.topic_id] = t
        self.changes.bump()
        return t

    async def delete_topic(self, name: str) -> None:
        t = self.topic(name)
        del self.topics[name]
        self.topics_by_id.pop(t.topic_id, None)
        self.changes.bump()
        for sid in t.streams:
            self._offsets.pop(sid, None)

    async def create_partitions(self, name: str, total: int, validate_only: bool) -> None:
        t = self.topic(name)
        if total <= len(t.streams):
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"topic {name!r} has {len(t.streams)} partitions; {total} is not more",
            )
        if not validate_only:
            self._add_partitions(t, total - len(t.streams))

    async def reassign_partitions(
        self, changes: list[tuple[str, int, int | None]]
    ) -> list[KafkaError | None]:
        out: list[KafkaError | None] = []
        for topic, partition, target in changes:
            try:
                self.stream_id(topic, partition)
                out.append(KafkaError(
                    ErrorCode.no_reassignment_in_progress if target is None
                    else ErrorCode.invalid_replica_assignment,
                    "the null engine is one broker: it leads every partition"))
            except KafkaError as e:
                out.append(e)
        return out

    async def pinned_partitions(self) -> list[tuple[str, int, int, int]]:
        return []

    async def set_topic_configs(
        self, name: str, configs: dict[str, str], validate_only: bool
    ) -> None:
        t = self.topic(name)
        valid = self.valid_configs(configs)
        if not validate_only:
            t.configs = valid
            self.changes.bump()

    # -- produce ---------------------------------------------------------------------------
    async def room(self) -> None:
        return None  # nothing is held: every batch is acknowledged at once

    def append(
        self, topic: str, partition: int, data: Buffer | None
    ) -> asyncio.Future[AppendResult]:
        """Acknowledged at once: the future is already resolved with the base offset."""
        offsets = self._offsets[self.stream_id(topic, partition)]
        if not data:
            raise KafkaError(ErrorCode.corrupt_message, "empty record set")
        try:
            count = sum(h.record_count for h in iter_headers(data))
        except CorruptBatchError as e:
            raise KafkaError(ErrorCode.corrupt_message, str(e)) from None
        base = offsets[1]
        offsets[1] = base + count
        done: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        done.set_result(AppendResult(base, -1))
        return done

    async def init_producer_id(self, producer_id: int, epoch: int) -> tuple[int, int]:
        if producer_id >= 0 and 0 <= epoch < 2**15 - 1:
            return producer_id, epoch + 1
        return next(self._producer_ids), 0

    # -- transactions: a marker takes an offset; nothing is stored, so nothing is open
    def append_marker(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool,
        coordinator_epoch: int,
    ) -> asyncio.Future[AppendResult]:
        offsets = self._offsets[self.stream_id(topic, partition)]
        offsets[1] += 1
        done: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        done.set_result(AppendResult(offsets[1] - 1, -1))
        return done

    def last_stable_offset(self, topic: str, partition: int) -> int:
        return self.offsets(topic, partition)[1]

    def aborted_transactions(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, int]]:
        return []

    # -- offsets and reads -----------------------------------------------------------------
    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        start, end = self._offsets[self.stream_id(topic, partition)]
        return start, end

    def log_position(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[int, int] | None:
        return None  # no shared log

    async def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> bytes:
        return (await self.read_records(topic, partition, offset, max_bytes, must_return_one)
                ).tobytes()

    async def read_records(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> RecordSet:
        """No records, ever; OFFSET_OUT_OF_RANGE outside [log start, high watermark]."""
        start, end = self.offsets(topic, partition)
        if not start <= offset <= end:
            raise KafkaError(
                ErrorCode.offset_out_of_range, f"offset {offset} not in [{start}, {end}]"
            )
        return EMPTY

    async def offset_for_time(
        self, topic: str, partition: int, timestamp: int
    ) -> tuple[int, int] | None:
        self.stream_id(topic, partition)
        return None  # no record is kept, so none has a timestamp

    def preferred_read_replica(
        self, topic: str, partition: int, rack: str, committed: bool
    ) -> int:
        return -1  # one broker

    async def replica_read(
        self, topic: str, partition: int, offset: int, max_bytes: int, committed: bool
    ) -> ReplicaRead:
        raise KafkaError(ErrorCode.not_leader_or_follower, "the null engine has no replicas")

    async def wait_for_data(self, keys: list[tuple[str, int]], timeout: float) -> None:
        await asyncio.sleep(timeout)  # nothing will ever be readable

    def commit_time(self, topic: str, partition: int, offset: int) -> float | None:
        self.stream_id(topic, partition)
        return None

    # -- log start -------------------------------------------------------------------------
    async def delete_records(self, topic: str, partition: int, offset: int) -> int:
        offsets = self._offsets[self.stream_id(topic, partition)]
        start, end = offsets
        target = end if offset == -1 else offset
        if not 0 <= target <= end:
            raise KafkaError(
                ErrorCode.offset_out_of_range, f"offset {offset} beyond the high watermark {end}"
            )
        offsets[0] = max(start, target)
        return offsets[0]

    async def apply_retention(self) -> int:
        return 0  # nothing is stored, so nothing expires


def _is_an_engine(e: NullStorage) -> StorageEngine:
    return e  # mypy checks that NullStorage conforms to the StorageEngine Protocol
