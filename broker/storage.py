"""The s3stream storage engine: topics, partitions, append, read, offsets on top of s3stream
(object WAL + metadata store), behind the `broker.engine.StorageEngine` interface.

Topics, partitions (each one s3stream stream), producer state and group offsets live in
broker.metadata's tables (`kafka`), on the same database and transactions as s3stream's
streams and objects (`meta`); producer rows go into the WAL's own commit.

Its maintenance is internal: compaction, retention and the log cleaner come out of
`maintenance_jobs` for the composition root to schedule; nothing outside the engine touches
`log`, `meta`, `kafka` or `producers`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prometheus_client.registry import Collector

from broker import costs, recordpolicy, storagemetrics
from broker.cluster import ClusterNode, ClusterSettings, ClusterView, Snapshot
from broker.cluster.groupguard import FencedGroupOffsets
from broker.cluster.racks import rack_replica
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
from broker.groups.offsets import GroupOffsetBackend
from broker.health import HealthCheck
from broker.logcleaner import BYTES_PER_KEY, CleanerSettings, LogCleaner
from broker.metadata import KafkaMetadata, PartitionRow, TopicRow, producer_rows
from broker.producers import SEQ_MODULUS, BatchMeta, Duplicate, ProducerStates
from broker.protocol import records
from broker.protocol.records import Buffer
from broker.protocol.recordset import RecordSet, RecordSetBuilder
from broker.replicas import ReplicaCollector, ReplicaReads
from broker.retention import retention_start
from broker.txn.partitions import TxnLog
from s3stream.compaction import CompactionSettings, Compactor
from s3stream.log import (
    READ_ATTEMPTS,
    ChunkData,
    LogStore,
    OffsetOutOfRangeError,
    ProducerBatch,
    ReadRaceError,
    StreamFencedError,
    StreamWriteError,
    UnknownStreamError,
    WalSettings,
    now_ms,
)
from s3stream.metadata import MetadataError, SqliteMetadataStore, StreamsFencedError
from s3stream.objectstore import ObjectNotFoundError, ObjectStore, RetryingObjectStore
from s3stream.stats import attributed

log = logging.getLogger(__name__)


class Storage(TopicTable):
    def __init__(
        self,
        objects: ObjectStore,
        meta: SqliteMetadataStore,
        wal: WalSettings,
        cluster: ClusterSettings | None = None,
        rack_aware: bool = True,
    ) -> None:
        super().__init__()
        self.objects = objects
        self.meta = meta
        self.kafka = KafkaMetadata(meta)
        self.log = LogStore(objects, meta, wal)
        # broker settings that are topic config defaults (config.topic_defaults); set by app
        self.topic_defaults: dict[str, str] = {}
        self.cluster_id = ""
        self.producers = ProducerStates()
        self.log.commit_attachments = producer_rows  # producer state commits with the data
        self.log.on_durable = self.producers.durable_append  # synchronous: see producers.py
        self.log.on_failed = self.producers.failed_streams
        # brokers sharing the metadata database (a cluster of one leads everything): the
        # partitions served are the ones this broker leads; every change to them is guarded
        self.cluster = ClusterNode(meta, cluster or ClusterSettings())
        self.log.guards = self.cluster.guards
        # offset commits land only from the broker that took the group over last
        self.group_offsets: GroupOffsetBackend = FencedGroupOffsets(self.kafka, self.cluster)
        self._topic_lock = asyncio.Lock()
        self.txns = TxnLog(self.log)  # open transactions and aborted ranges per partition
        self.traffic = costs.Traffic()  # bytes appended / served per stream (broker/costs.py)
        # partitions led elsewhere, served read-only to consumers (KIP-392, broker.replicas);
        # rack_aware: replica.selector.class is Kafka's RackAwareReplicaSelector (not '')
        self.replicas = ReplicaReads(self.log, meta, serve_batches)
        self.rack_aware = rack_aware

    async def open(self) -> None:
        await self.kafka.open()
        self.cluster_id = await self.meta.cluster_id()
        await self.log.open((), ())  # streams are loaded as this broker comes to lead them
        await self.cluster.register()
        await self._sync()
        self.cluster.start(self._sync)

    async def close(self) -> None:
        await self.log.close()  # flushes what is pending (still guarded by our epochs)
        await self.cluster.stop()  # hands our partitions over to the other brokers
        await self.kafka.close()
        await self.objects.close()

    # -- the cluster -----------------------------------------------------------------------
    async def _sync(self) -> None:
        async with self._topic_lock:
            await self._sync_locked()

    async def _sync_locked(self) -> None:
        """A heartbeat, then topics as the database has them, and the partitions this broker
        leads: newly led ones loaded from the store before they are served, lost ones
        dropped (their pending appends fail with NOT_LEADER_OR_FOLLOWER)."""
        snap = await self.cluster.heartbeat()
        self._sync_topics(snap)
        held = self.cluster.held
        me = self.cluster.node_id
        want = {} if not snap.registered else {
            sid: lead.epoch for sid, lead in snap.view.leaders.items() if lead.node_id == me}
        lost = [s for s, e in held.items() if want.get(s) != e]
        for sid in lost:
            del held[sid]
            self.log.drop_stream(sid)
            self.producers.drop_stream(sid)
            self.txns.drop(sid)
        if lost:
            log.info("broker %d no longer leads streams %s", me, lost)
        take = sorted(s for s in want if s not in held)
        self.replicas.sweep()
        for sid in take:
            self.replicas.drop(sid)  # led from now on: served from the log's own state
        if not take:
            return
        state = await self.kafka.load_streams(take)
        self.log.load_streams(state.streams, state.chunks, state.object_keys)
        for sid in take:
            self.producers.drop_stream(sid)
        self.producers.load(state.producers)
        await self.txns.rebuild(await self.kafka.txn_streams(take))  # before they are served
        for s in state.streams:
            held[s.stream_id] = want[s.stream_id]
        log.info("broker %d leads %d partitions (took %d)", me, len(held), len(state.streams))

    def _sync_topics(self, snap: Snapshot) -> None:
        """Topics, configs and partitions as the database has them (any broker may change
        them)."""
        rows = {r.name: r for r in snap.topics}
        changed = False
        for name in [n for n, t in self.topics.items()
                     if n not in rows or rows[n].topic_id != t.topic_id]:
            t = self.topics.pop(name)
            self.topics_by_id.pop(t.topic_id, None)
            changed = True
        parts: dict[str, list[PartitionRow]] = {}
        for p in snap.partitions:
            parts.setdefault(p.topic, []).append(p)
        for name, row in rows.items():
            known = self.topics.get(name)
            t = known if known is not None else self._add_topic(row)
            changed = changed or known is None
            if t.configs != row.configs:
                t.configs, changed = row.configs, True
            for p in parts.get(name, []):  # in partition order
                if p.partition == len(t.streams):
                    t.streams.append(p.stream_id)
        if changed:
            self.changes.bump()

    def cluster_view(self) -> ClusterView | None:
        return self.cluster.view

    def led_epoch(self, topic: str, partition: int) -> int | None:
        sid = self.stream_id(topic, partition)
        return self.cluster.held.get(sid) if self.cluster.serves(sid) else None

    async def advertise(self, host: str, port: int) -> None:
        """The address clients reach this broker at (Metadata of every broker lists it)."""
        await self.cluster.advertise(host, port)
        await self._sync()

    def _served(self, topic: str, partition: int) -> int:
        """The partition's stream id if this broker serves it, else NOT_LEADER_OR_FOLLOWER
        (UNKNOWN_TOPIC_OR_PARTITION if there is no such partition)."""
        sid = self.stream_id(topic, partition)
        if not self.cluster.serves(sid):
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"broker {self.cluster.node_id} does not lead {topic}-{partition}")
        return sid

    def _add_topic(self, row: TopicRow) -> Topic:
        t = Topic(row.name, row.topic_id, dict(row.configs), defaults=self.topic_defaults)
        self.topics[t.name] = t
        self.topics_by_id[t.topic_id] = t
        return t

    # -- topics ----------------------------------------------------------------------------
    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> Topic:
        async with self._topic_lock:
            valid = self.check_new_topic(name, partitions, configs)
            try:
                row, streams = await self.kafka.create_topic(name, partitions, valid)
            except MetadataError as e:
                if e.retriable:  # the metadata database is unreachable: try again later
                    raise KafkaError(ErrorCode.request_timed_out, str(e)) from None
                raise KafkaError(ErrorCode.topic_already_exists, str(e)) from None
            t = self._add_topic(row)
            t.streams.extend(s.stream_id for s in streams)
            self.changes.bump()
            await self._sync_quietly()  # the controller places the partitions
            return t

    async def _sync_quietly(self) -> None:
        """A heartbeat after a topic change (so that new partitions get a leader now); a
        failure is only logged: the change is made, the next heartbeat places them."""
        try:
            await self._sync_locked()
        except Exception as e:
            log.warning("heartbeat after a topic change failed: %r", e)

    async def delete_topic(self, name: str) -> None:
        async with self._topic_lock:
            t = self.topic(name)
            await self.kafka.delete_topic(name)
            del self.topics[name]
            self.topics_by_id.pop(t.topic_id, None)
            self.changes.bump()
            for sid in t.streams:
                self.cluster.held.pop(sid, None)
                self.replicas.drop(sid)
                self.log.drop_stream(sid)
                self.producers.drop_stream(sid)
                self.txns.drop(sid)

    async def create_partitions(self, name: str, total: int, validate_only: bool) -> None:
        async with self._topic_lock:
            t = self.topic(name)
            if total <= len(t.streams):
                raise KafkaError(
                    ErrorCode.invalid_partitions,
                    f"topic {name!r} has {len(t.streams)} partitions; {total} is not more",
                )
            if validate_only:
                return
            for s in await self.kafka.add_partitions(name, len(t.streams), total - len(t.streams)):
                t.streams.append(s.stream_id)
            await self._sync_quietly()

    # -- partition reassignments ----------------------------------------------------------
    async def reassign_partitions(
        self, changes: list[tuple[str, int, int | None]]
    ) -> list[KafkaError | None]:
        codes = {"unknown": ErrorCode.unknown_topic_or_partition,
                 "broker": ErrorCode.invalid_replica_assignment,
                 "none": ErrorCode.no_reassignment_in_progress}
        return [None if e is None else KafkaError(codes[e.reason], str(e))
                for e in await self.cluster.reassign(changes)]

    async def pinned_partitions(self) -> list[tuple[str, int, int, int]]:
        return [(p.topic, p.partition, p.leader, p.target) for p in await self.cluster.pins()]

    async def set_topic_configs(
        self, name: str, configs: dict[str, str], validate_only: bool
    ) -> None:
        t = self.topic(name)
        valid = self.valid_configs(configs)
        if validate_only:
            return
        await self.kafka.set_topic_configs(name, valid)
        t.configs = valid
        self.changes.bump()

    # -- produce ---------------------------------------------------------------------------
    async def room(self) -> None:
        await self.log.room()  # see s3stream.wal: WAL bytes appended and not yet committed

    def append(
        self, topic: str, partition: int, data: Buffer | None
    ) -> asyncio.Future[AppendResult]:
        """Validate and append a produced record set; synchronous up to the durability wait,
        so that calls made in order get offsets in that order. A writable `data` (a view into
        the request's frame) gets its offsets written in place and goes to the WAL as it is."""
        t = self.topic(topic)
        sid = self._served(topic, partition)
        if not data:
            raise KafkaError(ErrorCode.corrupt_message, "empty record set")
        data, headers = recordpolicy.apply(data, t.config)
        idempotent = headers[0].producer_id >= 0
        if idempotent and len(headers) != 1:
            raise KafkaError(
                ErrorCode.invalid_record,
                "an idempotent produce must carry exactly one batch per partition",
            )
        if idempotent:
            h0 = headers[0]
            last_seq = (h0.base_sequence + h0.last_offset_delta) % SEQ_MODULUS
            dup = self.producers.check(
                sid, h0.producer_id, h0.producer_epoch, h0.base_sequence, last_seq
            )
            if dup is not None:
                return self._duplicate(dup)
        log_append = t.config.log_append_time
        append_time = now_ms() if log_append else None
        count = sum(h.record_count for h in headers)
        max_ts = append_time if append_time is not None else max(h.max_timestamp for h in headers)

        def encode(base: int) -> bytearray | memoryview:
            buf = data if isinstance(data, memoryview) and not data.readonly else bytearray(data)
            records.assign_offsets(buf, headers, base, append_time)
            return buf

        producer = None
        if idempotent:
            producer = ProducerBatch(h0.producer_id, h0.producer_epoch, h0.base_sequence, last_seq)
        base, durable = self.log.append(sid, count, max_ts, encode, producer)
        self.traffic.appended(sid, len(data))
        result: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        if producer is not None:
            self._track_producer(sid, producer, base, base + count - 1, result)
            self.txns.index.appended(sid, h0, base)  # a transactional batch opens its txn

        def done(f: asyncio.Future[int]) -> None:
            if result.done():
                return
            exc = f.exception()
            if exc is None:
                result.set_result(
                    AppendResult(f.result(), -1 if append_time is None else append_time)
                )
            elif isinstance(exc, UnknownStreamError):
                result.set_exception(KafkaError(ErrorCode.unknown_topic_or_partition))
            elif isinstance(exc, StreamFencedError):
                result.set_exception(KafkaError(ErrorCode.not_leader_or_follower, str(exc)))
            elif isinstance(exc, StreamWriteError):
                result.set_exception(KafkaError(ErrorCode.kafka_storage_error, str(exc)))
            else:
                result.set_exception(exc)

        durable.add_done_callback(done)
        return result

    def _track_producer(
        self,
        sid: int,
        p: ProducerBatch,
        base: int,
        last: int,
        result: asyncio.Future[AppendResult],
    ) -> None:
        """Add the batch to the pending view; the log moves it to the durable view when it is
        committed, or resets the stream's pending view when a flush fails (synchronously,
        LogStore.on_durable / on_failed), never later from a callback of `result`."""
        meta = BatchMeta(p.first_seq, p.last_seq, base, last, result)
        self.producers.appended(sid, p.producer_id, p.epoch, meta)

    def _duplicate(self, dup: Duplicate) -> asyncio.Future[AppendResult]:
        out: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        original = dup.batch.durable
        if original is None or (original.done() and original.exception() is None):
            out.set_result(AppendResult(dup.batch.base_offset, -1))
            return out

        def done(f: asyncio.Future[Any]) -> None:
            if out.done():
                return
            exc = f.exception()
            if exc is None:
                out.set_result(AppendResult(dup.batch.base_offset, -1))
            else:
                out.set_exception(exc)

        original.add_done_callback(done)
        return out

    async def init_producer_id(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """A new idempotent producer id (epoch 0), or, for a known one, its next epoch."""
        if producer_id >= 0 and 0 <= epoch < 2**15 - 1:
            return producer_id, epoch + 1
        return await self.kafka.next_producer_id(), 0

    # -- transactions (broker.txn) ---------------------------------------------------------
    def append_marker(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool,
        coordinator_epoch: int,
    ) -> asyncio.Future[AppendResult]:
        return self.txns.append_marker(
            self._served(topic, partition), producer_id, epoch, commit, coordinator_epoch
        )

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """Never below the log start (DeleteRecords may pass an open transaction's start)."""
        sid = self._served(topic, partition)
        st = self.log.stream(sid)
        return max(st.start_offset, self.txns.index.lso(sid, st.end_offset))

    def aborted_transactions(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, int]]:
        sid = self._served(topic, partition)
        return [(a.producer_id, a.first_offset) for a in self.txns.index.aborted(sid, start, end)]

    # -- offsets and reads -----------------------------------------------------------------
    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, high watermark)."""
        st = self.log.stream(self._served(topic, partition))
        return st.start_offset, st.end_offset

    def log_position(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[int, int] | None:
        try:
            sid = self._served(topic, partition)
        except KafkaError:
            return None  # its read answers the error
        return self.log.log_position(sid, offset, max_bytes)

    async def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> bytes:
        """`read_records`, joined."""
        return (await self.read_records(topic, partition, offset, max_bytes, must_return_one)
                ).tobytes()

    async def read_records(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> RecordSet:
        """Whole batches from the one holding `offset`, within max_bytes (at least one batch
        if must_return_one). Raises OFFSET_OUT_OF_RANGE outside [log start, high watermark].
        What is served is checked (see `serve_batches`); a read that raced a chunk swap is made
        again from a fresh snapshot, and answered KAFKA_STORAGE_ERROR (retriable) if it keeps
        racing: a gap is never served."""
        sid = self._served(topic, partition)
        for attempt in range(1, READ_ATTEMPTS + 1):
            st = self.log.stream(sid)
            if offset < st.start_offset or offset > st.end_offset:
                raise KafkaError(
                    ErrorCode.offset_out_of_range,
                    f"offset {offset} not in [{st.start_offset}, {st.end_offset}]",
                )
            try:
                with attributed(((sid, 1.0),)):  # its GETs cost this partition's topic
                    chunks = await self.log.read_chunks(sid, offset, max_bytes)
                served = serve_batches(chunks, offset, max_bytes, must_return_one)
                self.traffic.served(sid, len(served))
                return served
            except OffsetOutOfRangeError as e:  # retention moved the log start meanwhile
                raise KafkaError(ErrorCode.offset_out_of_range, str(e)) from None
            except UnknownStreamError:  # the partition moved to another broker meanwhile
                raise KafkaError(ErrorCode.not_leader_or_follower) from None
            except ReadRaceError as e:
                if attempt == READ_ATTEMPTS:
                    log.error("read of %s-%d at %d: %s", topic, partition, offset, e)
                    raise KafkaError(ErrorCode.kafka_storage_error, str(e)) from None
        raise AssertionError("unreachable")

    # -- read replicas (KIP-392) ------------------------------------------------------------
    def preferred_read_replica(
        self, topic: str, partition: int, rack: str, committed: bool
    ) -> int:
        """Kafka's RackAwareReplicaSelector on shared storage: when the consumer's rack is not
        this leader's and a live broker of that rack exists, that broker (of several, the one
        the stream id picks: partitions spread over them). Not for read_committed fetches of
        a partition with transactions (replicas refuse those)."""
        view = self.cluster.view
        if not self.rack_aware or not rack or rack == self.cluster.settings.rack:
            return -1
        sid = self.stream_id(topic, partition)
        if not self.cluster.serves(sid):
            return -1
        if committed and self.txns.index.get(sid) is not None:
            return -1
        return rack_replica(view.brokers, rack, sid)  # Metadata lists it: broker.cluster.racks

    async def replica_read(
        self, topic: str, partition: int, offset: int, max_bytes: int, committed: bool
    ) -> ReplicaRead:
        sid = self.stream_id(topic, partition)
        if self.cluster.serves(sid):  # the leader serves it from its own state
            raise KafkaError(ErrorCode.not_leader_or_follower, "led here: not a replica read")
        if not self.cluster.lease_valid():
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"broker {self.cluster.node_id}'s lease lapsed")
        with attributed(((sid, 1.0),)):
            got = await self.replicas.serve_read(sid, offset, max_bytes, committed)
        self.traffic.served(sid, len(got.data))
        return got

    async def offset_for_time(
        self, topic: str, partition: int, timestamp: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp`; for -3 the
        record with the largest timestamp. None when there is none. Looks at a snapshot of the
        chunk list, and again at a fresh one if a chunk's object was deleted meanwhile."""
        sid = self._served(topic, partition)
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                return await self._offset_for_time(sid, timestamp)
            except ObjectNotFoundError as e:
                if attempt == READ_ATTEMPTS:
                    raise KafkaError(ErrorCode.kafka_storage_error, repr(e)) from None
        raise AssertionError("unreachable")

    async def _offset_for_time(self, sid: int, timestamp: int) -> tuple[int, int] | None:
        st = self.log.stream(sid)
        chunks = st.chunks  # a snapshot (s3stream.index.Stream): st.chunks is not used again
        if timestamp == -3:
            if not chunks:
                return None
            candidates = [max(chunks, key=lambda c: c.max_timestamp)]
        else:  # the first chunk that has a record at or after `timestamp`
            first = next((i for i, c in enumerate(chunks) if c.max_timestamp >= timestamp), None)
            if first is None:
                return None
            candidates = chunks[first:]
        found: tuple[int, int] | None = None
        for c in candidates:
            data = await self.log.chunk_data(c)
            for h in records.iter_headers(data):
                if h.is_control:
                    continue
                for off, ts in records.record_timestamps(data, h):
                    if off < st.start_offset:
                        continue
                    if timestamp == -3:
                        if found is None or ts > found[1]:
                            found = (off, ts)
                    elif ts >= timestamp:
                        return off, ts
        return found

    def commit_time(self, topic: str, partition: int, offset: int) -> float | None:
        st = self.log.streams.get(self.stream_id(topic, partition))
        return None if st is None else st.commit_time(offset)

    # -- log start: DeleteRecords and retention --------------------------------------------
    async def delete_records(self, topic: str, partition: int, offset: int) -> int:
        sid = self._served(topic, partition)
        st = self.log.stream(sid)
        start, end = st.start_offset, st.end_offset
        target = end if offset == -1 else offset
        if not 0 <= target <= end:
            raise KafkaError(
                ErrorCode.offset_out_of_range, f"offset {offset} beyond the high watermark {end}"
            )
        if target <= start:
            return start
        try:
            return await self.log.truncate(sid, target)
        except StreamsFencedError as e:  # led by another broker since the check above
            raise KafkaError(ErrorCode.not_leader_or_follower, str(e)) from None

    async def apply_retention(self) -> int:
        """One pass over every topic with a delete policy: `retention.ms` / `retention.bytes`
        move a partition's log start past whole chunks (see `broker.retention`)."""
        moved = 0
        now = int(time.time() * 1000)
        for topic in list(self.topics.values()):
            if not topic.config.delete:
                continue
            retention_ms = topic.config.retention_ms
            retention_bytes = topic.config.retention_bytes
            for sid in list(topic.streams):
                st = self.log.streams.get(sid)
                if st is None:
                    continue
                start = retention_start(st, retention_ms, retention_bytes, now)
                if start > st.start_offset:
                    try:
                        await self.log.truncate(sid, start)
                    except StreamsFencedError:  # led by another broker now: its job
                        continue
                    log.info("retention: %s moved log start to %d", topic.name, start)
                    moved += 1
        return moved

    def maintenance_jobs(self, settings: Settings) -> list[MaintenanceJob]:
        compaction = CompactionSettings(
            interval_ms=settings.compaction_interval_ms,
            min_age_ms=settings.compaction_min_age_ms,
            max_bytes_per_run=settings.compaction_max_bytes,
            stream_object_max_bytes=settings.stream_object_max_bytes,
            chunk_max_bytes=settings.stream_chunk_max_bytes,
            gc_delay_ms=settings.objects_gc_delay_ms,
        )
        jobs = [
            MaintenanceJob(
                "compaction",
                settings.compaction_interval_ms,
                Compactor(self.log, compaction).run_once,
            ),
            MaintenanceJob(
                "retention", settings.log_retention_check_interval_ms, self.apply_retention
            ),
        ]
        if settings.log_cleaner_enable:
            cleaner = CleanerSettings(
                backoff_ms=settings.log_cleaner_backoff_ms,
                max_keys=settings.log_cleaner_dedupe_buffer_size // BYTES_PER_KEY,
                chunk_max_bytes=settings.stream_chunk_max_bytes,
                object_max_bytes=settings.stream_object_max_bytes,
            )
            jobs.append(
                MaintenanceJob(
                    "log cleaner",
                    settings.log_cleaner_backoff_ms,
                    LogCleaner(self, cleaner).run_once,
                )
            )
        return jobs

    def health_checks(self, settings: Settings) -> list[HealthCheck]:
        return storagemetrics.health_checks(
            self.objects, settings.object_store_url, self.meta.cluster_id, settings.metadata_url
        )

    def collectors(self) -> list[Collector]:
        out: list[Collector] = [storagemetrics.StorageCollector(self.log, self.objects),
                                ReplicaCollector(self.replicas)]
        if isinstance(self.objects, RetryingObjectStore):  # it counts what each call costs
            out.append(costs.CostCollector(self.objects.stats.costs, self.traffic, self))
        return out

    async def wait_for_data(self, keys: list[tuple[str, int]], timeout: float) -> None:
        sids = []
        for topic, partition in keys:
            t = self.topics.get(topic)
            if t is not None and 0 <= partition < len(t.streams):
                sids.append(t.streams[partition])
        replicas = {s: r.stream.end_offset for s in sids
                    if not self.cluster.serves(s) and (r := self.replicas.replicas.get(s))}
        if not replicas:
            await self.log.wait_for_append(sids, timeout)
            return
        waits = [asyncio.ensure_future(self.log.wait_for_append(sids, timeout)),
                 asyncio.ensure_future(self.replicas.wait(replicas, timeout))]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


def serve_batches(
    chunks: list[ChunkData], offset: int, max_bytes: int, must_return_one: bool
) -> RecordSet:
    """The batches of contiguous `chunks` (LogStore.read_chunks) from the one holding `offset`,
    within max_bytes (at least one if must_return_one), as views of the chunks (see
    broker.protocol.recordset). Raises ReadRaceError, serving nothing, unless every batch lies
    inside its chunk's offset range and starts after the previous one ends. A batch may start
    after `offset`, or after the previous batch's end, only where compaction
    (cleanup.policy=compact) dropped records; that no chunk was skipped is what the chunks'
    contiguity proves."""
    out = RecordSetBuilder()
    after = -1  # the offset following the last batch seen
    for c in chunks:
        for h in records.iter_headers(c.data):
            if h.base_offset < max(c.base_offset, after) or h.last_offset > c.last_offset:
                raise ReadRaceError(
                    f"batch [{h.base_offset}, {h.last_offset}] out of place in chunk"
                    f" [{c.base_offset}, {c.last_offset}] after offset {after - 1}"
                )
            after = h.next_offset
            if h.next_offset <= offset:
                continue
            if len(out) + h.size > max_bytes and (len(out) or not must_return_one):
                return out.build()
            out.add(c.data, h)
    return out.build()


def _is_an_engine(s: Storage) -> StorageEngine:
    return s  # mypy checks that Storage conforms to the StorageEngine Protocol
