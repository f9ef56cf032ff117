"""The Kafka-level storage the handlers call: topics, partitions, append, read, offsets.

One implementation here, on top of s3stream (object WAL + metadata store); the handlers see
only this module's interface, so other engines can sit behind it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from broker import recordpolicy
from broker.config import ConfigError, topic_config_value, validate_topic_configs
from broker.errors import ErrorCode, KafkaError
from broker.producers import SEQ_MODULUS, BatchMeta, Duplicate, ProducerStates
from broker.protocol import records
from s3stream.log import (
    READ_ATTEMPTS,
    ChunkData,
    LogStore,
    OffsetOutOfRangeError,
    ReadRaceError,
    StreamWriteError,
    UnknownStreamError,
    WalSettings,
    now_ms,
)
from s3stream.metadata import MetadataError, SqliteMetadataStore, TopicRow
from s3stream.objectstore import ObjectNotFoundError, ObjectStore

log = logging.getLogger(__name__)
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


@dataclass(eq=False)
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    streams: list[int] = field(default_factory=list)  # stream id of each partition
    defaults: dict[str, str] = field(default_factory=dict)  # broker defaults (shared dict)
    # parsed values of `configs` (the produce path reads several per append); `configs` is
    # replaced, never edited, when a topic's configs change, which resets this
    _parsed: tuple[dict[str, str], dict[str, object]] = field(
        default_factory=lambda: ({}, {}), repr=False
    )

    def config(self, key: str) -> object:
        source, values = self._parsed
        if source is not self.configs:
            source, values = self.configs, {}
            self._parsed = (source, values)
        if key not in values:
            values[key] = topic_config_value(self.configs, key, self.defaults)
        return values[key]


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_append_time: int  # -1 for CreateTime topics


class Storage:
    def __init__(self, objects: ObjectStore, meta: SqliteMetadataStore, wal: WalSettings) -> None:
        self.objects = objects
        self.meta = meta
        self.log = LogStore(objects, meta, wal)
        # broker settings that are topic config defaults (config.topic_defaults); set by app
        self.topic_defaults: dict[str, str] = {}
        self.topics: dict[str, Topic] = {}
        self.topics_by_id: dict[uuid.UUID, Topic] = {}
        self.cluster_id = ""
        self.producers = ProducerStates()
        self.log.on_durable = self.producers.durable_append  # synchronous: see producers.py
        self.log.on_failed = self.producers.failed_streams
        self._topic_lock = asyncio.Lock()

    async def open(self) -> None:
        await self.meta.open()
        self.cluster_id = await self.meta.cluster_id()
        topic_rows, streams, chunks = await self.meta.load()
        for t in topic_rows:
            self._add_topic(t)
        for s in sorted(streams, key=lambda s: s.partition):
            topic = self.topics.get(s.topic)
            if topic is not None and s.partition == len(topic.streams):
                topic.streams.append(s.stream_id)
        await self.log.open(streams, chunks)
        self.producers.load(await self.meta.load_producers())

    async def close(self) -> None:
        await self.log.close()
        await self.meta.close()
        await self.objects.close()

    def _add_topic(self, row: TopicRow) -> Topic:
        t = Topic(row.name, row.topic_id, dict(row.configs), defaults=self.topic_defaults)
        self.topics[t.name] = t
        self.topics_by_id[t.topic_id] = t
        return t

    # -- topics ----------------------------------------------------------------------------
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
        check_topic_name(name)
        if name in self.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        if partitions <= 0:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"number of partitions must be positive, got {partitions}",
            )
        try:
            return validate_topic_configs(configs)
        except ConfigError as e:
            raise KafkaError(ErrorCode.invalid_config, str(e)) from None

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> Topic:
        async with self._topic_lock:
            valid = self.check_new_topic(name, partitions, configs)
            try:
                row, streams = await self.meta.create_topic(name, partitions, valid)
            except MetadataError as e:
                if e.retriable:  # the metadata database is unreachable: try again later
                    raise KafkaError(ErrorCode.request_timed_out, str(e)) from None
                raise KafkaError(ErrorCode.topic_already_exists, str(e)) from None
            t = self._add_topic(row)
            for s in streams:
                self.log.add_stream(s)
                t.streams.append(s.stream_id)
            return t

    async def delete_topic(self, name: str) -> None:
        async with self._topic_lock:
            t = self.topic(name)
            await self.meta.delete_topic(name)
            del self.topics[name]
            self.topics_by_id.pop(t.topic_id, None)
            for sid in t.streams:
                self.log.drop_stream(sid)
                self.producers.drop_stream(sid)

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
            for s in await self.meta.add_partitions(name, len(t.streams), total - len(t.streams)):
                self.log.add_stream(s)
                t.streams.append(s.stream_id)

    async def set_topic_configs(
        self, name: str, configs: dict[str, str], validate_only: bool
    ) -> None:
        t = self.topic(name)
        try:
            valid = validate_topic_configs(configs)
        except ConfigError as e:
            raise KafkaError(ErrorCode.invalid_config, str(e)) from None
        if validate_only:
            return
        await self.meta.set_topic_configs(name, valid)
        t.configs = valid

    # -- produce ---------------------------------------------------------------------------
    def append(
        self, topic: str, partition: int, data: bytes | None
    ) -> asyncio.Future[AppendResult]:
        """Validate and append a produced record set; synchronous up to the durability wait,
        so that calls made in order get offsets in that order."""
        t = self.topic(topic)
        sid = self.stream_id(topic, partition)
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
        log_append = str(t.config("message.timestamp.type")).lower() == "logappendtime"
        append_time = now_ms() if log_append else None
        count = sum(h.record_count for h in headers)
        max_ts = append_time if append_time is not None else max(h.max_timestamp for h in headers)

        def encode(base: int) -> bytearray:
            buf = bytearray(data)
            records.assign_offsets(buf, headers, base, append_time)
            return buf

        producer = None
        if idempotent:
            producer = (h0.producer_id, h0.producer_epoch, h0.base_sequence, last_seq)
        base, durable = self.log.append(sid, count, max_ts, encode, producer)
        result: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        if producer is not None:
            self._track_producer(sid, producer, base, base + count - 1, result)

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
            elif isinstance(exc, StreamWriteError):
                result.set_exception(KafkaError(ErrorCode.kafka_storage_error, str(exc)))
            else:
                result.set_exception(exc)

        durable.add_done_callback(done)
        return result

    def _track_producer(
        self,
        sid: int,
        producer: tuple[int, int, int, int],
        base: int,
        last: int,
        result: asyncio.Future[AppendResult],
    ) -> None:
        """Add the batch to the pending view; the log moves it to the durable view when it is
        committed, or resets the stream's pending view when a flush fails (synchronously,
        LogStore.on_durable / on_failed), never later from a callback of `result`."""
        pid, epoch, first_seq, last_seq = producer
        self.producers.appended(sid, pid, epoch, BatchMeta(first_seq, last_seq, base, last, result))

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
        return await self.meta.next_producer_id(), 0

    # -- offsets and reads -----------------------------------------------------------------
    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, high watermark)."""
        st = self.log.stream(self.stream_id(topic, partition))
        return st.start_offset, st.end_offset

    async def read(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> bytes:
        """Whole batches from the one holding `offset`, within max_bytes (at least one batch
        if must_return_one). Raises OFFSET_OUT_OF_RANGE outside [log start, high watermark].
        What is served is checked (see `serve_batches`); a read that raced a chunk swap is made
        again from a fresh snapshot, and answered KAFKA_STORAGE_ERROR (retriable) if it keeps
        racing: a gap is never served."""
        sid = self.stream_id(topic, partition)
        for attempt in range(1, READ_ATTEMPTS + 1):
            st = self.log.stream(sid)
            if offset < st.start_offset or offset > st.end_offset:
                raise KafkaError(
                    ErrorCode.offset_out_of_range,
                    f"offset {offset} not in [{st.start_offset}, {st.end_offset}]",
                )
            try:
                chunks = await self.log.read_chunks(sid, offset, max_bytes)
                return serve_batches(chunks, offset, max_bytes, must_return_one)
            except OffsetOutOfRangeError as e:  # retention moved the log start meanwhile
                raise KafkaError(ErrorCode.offset_out_of_range, str(e)) from None
            except ReadRaceError as e:
                if attempt == READ_ATTEMPTS:
                    log.error("read of %s-%d at %d: %s", topic, partition, offset, e)
                    raise KafkaError(ErrorCode.kafka_storage_error, str(e)) from None
        raise AssertionError("unreachable")

    async def offset_for_time(
        self, topic: str, partition: int, timestamp: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp`; for -3 the
        record with the largest timestamp. None when there is none. Looks at a snapshot of the
        chunk list, and again at a fresh one if a chunk's object was deleted meanwhile."""
        sid = self.stream_id(topic, partition)
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                return await self._offset_for_time(sid, timestamp)
            except ObjectNotFoundError as e:
                if attempt == READ_ATTEMPTS:
                    raise KafkaError(ErrorCode.kafka_storage_error, repr(e)) from None
        raise AssertionError("unreachable")

    async def _offset_for_time(self, sid: int, timestamp: int) -> tuple[int, int] | None:
        st = self.log.stream(sid)
        chunks = st.chunks  # a snapshot (s3stream.log.Stream): st.chunks is not used again
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

    async def wait_for_data(self, keys: list[tuple[str, int]], timeout: float) -> None:
        sids = []
        for topic, partition in keys:
            t = self.topics.get(topic)
            if t is not None and 0 <= partition < len(t.streams):
                sids.append(t.streams[partition])
        await self.log.wait_for_append(sids, timeout)


def serve_batches(
    chunks: list[ChunkData], offset: int, max_bytes: int, must_return_one: bool
) -> bytes:
    """The batches of contiguous `chunks` (LogStore.read_chunks) from the one holding `offset`,
    within max_bytes (at least one if must_return_one). Raises ReadRaceError, serving nothing,
    unless every batch lies inside its chunk's offset range and starts after the previous one
    ends. A batch may start after `offset`, or after the previous batch's end, only where
    compaction (cleanup.policy=compact) dropped records; that no chunk was skipped is what the
    chunks' contiguity proves."""
    parts: list[memoryview] = []
    total = 0
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
            if total + h.size > max_bytes and (parts or not must_return_one):
                return b"".join(parts)
            parts.append(memoryview(c.data)[h.position : h.position + h.size])
            total += h.size
    return b"".join(parts)
