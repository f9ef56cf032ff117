"""The broker's Kafka metadata: topics and their configs, which s3stream stream holds each
partition, idempotent producer state, committed group offsets, the producer id counter.

`KafkaMetadata` wraps the s3stream `MetadataStore` of the same database and runs on its
plumbing (one thread and connection, `_txn` transactions, reconnection; see
s3stream.metadata.base): creating a topic creates its streams, and deleting one deletes its
streams, chunks and producer rows, each in one transaction. Producer rows are written by the
WAL's own commit (broker.metadata.producers).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from broker.metadata.model import PartitionRow, ProducerBatchRow, TopicRow
from broker.metadata.offsets import GroupOffsetsMixin
from broker.metadata.schema import COMPONENT
from broker.metadata.txns import TxnStateMixin
from s3stream.metadata import ChunkRow, MetadataError, MetadataStore, StreamRow
from s3stream.metadata.base import marks


@dataclass(frozen=True)
class KafkaState:
    """Everything a broker loads at start, read in one snapshot."""

    topics: list[TopicRow]
    partitions: list[PartitionRow]
    streams: list[StreamRow]
    chunks: list[ChunkRow]
    producers: list[ProducerBatchRow]


@dataclass(frozen=True)
class StreamsState:
    """What a broker taking over some partitions loads, read in one snapshot."""

    streams: list[StreamRow]
    chunks: list[ChunkRow]
    object_keys: dict[int, str]
    producers: list[ProducerBatchRow]


class KafkaMetadata(GroupOffsetsMixin, TxnStateMixin):
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def open(self) -> None:
        """Open the store (s3stream's migrations), then bring the broker's tables up to date
        (moving what older versions kept in s3stream's tables; see .schema)."""
        await self.store.open()
        await self.store.migrate(COMPONENT)

    async def close(self) -> None:
        await self.store.close()

    # -- reads -----------------------------------------------------------------------------
    def _load(self) -> KafkaState:
        with self.store._txn(read_only=True) as db:
            topics = [TopicRow(name, uuid.UUID(tid), json.loads(cfg)) for name, tid, cfg
                      in db.execute("SELECT name, topic_id, configs FROM kafka_topics")]
            partitions = [PartitionRow(*r) for r in db.execute(
                "SELECT topic, partition, stream_id FROM kafka_partitions"
                " ORDER BY topic, partition")]
            streams, chunks = self.store._read_log(db)
            producers = [ProducerBatchRow(*r) for r in db.execute(
                "SELECT p.stream_id, p.producer_id, p.epoch, p.first_seq, p.last_seq,"
                " p.base_offset, p.last_offset FROM kafka_producer_batches p"
                " JOIN kafka_partitions k USING (stream_id)"
                " ORDER BY p.stream_id, p.producer_id, p.base_offset")]
        return KafkaState(topics, partitions, streams, chunks, producers)

    async def load(self) -> KafkaState:
        return await self.store._run(self._load)

    def _load_streams(self, stream_ids: list[int]) -> StreamsState:
        with self.store._txn(read_only=True) as db:
            streams, chunks, keys = self.store._read_streams(db, stream_ids)
            producers = [ProducerBatchRow(*r) for r in db.execute(
                "SELECT stream_id, producer_id, epoch, first_seq, last_seq, base_offset,"
                " last_offset FROM kafka_producer_batches WHERE stream_id IN"
                f" ({marks(len(stream_ids))}) ORDER BY stream_id, producer_id, base_offset",
                stream_ids)]
        return StreamsState(streams, chunks, keys, producers)

    async def load_streams(self, stream_ids: list[int]) -> StreamsState:
        """What serving these partitions needs, read in one snapshot: their streams (end
        offsets), chunks and the chunks' object keys, and producer state."""
        return await self.store._run(self._load_streams, stream_ids)

    # -- topics ----------------------------------------------------------------------------
    def _create_topic(
        self, name: str, partitions: int, configs: dict[str, str]
    ) -> tuple[TopicRow, list[StreamRow]]:
        with self.store._txn() as db:
            if db.execute("SELECT 1 FROM kafka_topics WHERE name=?", (name,)).fetchone():
                raise MetadataError(f"topic {name!r} already exists")
            tid = uuid.uuid4()
            db.execute(  # a concurrent creator of the same name fails here (primary key)
                "INSERT INTO kafka_topics(name, topic_id, configs, created_ms)"
                " VALUES (?,?,?,?)",
                (name, str(tid), json.dumps(configs), int(time.time() * 1000)),
            )
            streams = self._add_streams(name, 0, partitions)
        return TopicRow(name, tid, configs), streams

    def _add_streams(self, topic: str, first: int, count: int) -> list[StreamRow]:
        db = self.store.db
        streams = self.store._new_streams(db, count)
        db.executemany("INSERT INTO kafka_partitions(topic, partition, stream_id) VALUES (?,?,?)",
                       [(topic, first + i, s.stream_id) for i, s in enumerate(streams)])
        return streams

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str]
    ) -> tuple[TopicRow, list[StreamRow]]:
        """The topic and its partitions' new streams (in partition order)."""
        return await self.store._run(self._create_topic, name, partitions, configs)

    def _lock_topic(self, name: str) -> None:
        """Serialise changes to a topic's partitions (adding them, deleting the topic)."""
        self.store.db.execute(f"SELECT 1 FROM kafka_topics WHERE name=?{self.store.for_update}",
                              (name,))

    def _add_partitions(self, topic: str, first: int, count: int) -> list[StreamRow]:
        with self.store._txn():
            self._lock_topic(topic)
            return self._add_streams(topic, first, count)

    async def add_partitions(self, topic: str, first: int, count: int) -> list[StreamRow]:
        """Partitions first .. first+count-1 of topic, with their new streams."""
        return await self.store._run(self._add_partitions, topic, first, count)

    def _delete_topic(self, name: str) -> None:
        with self.store._txn() as db:
            self._lock_topic(name)
            ids = [int(sid) for (sid,) in db.execute(
                "SELECT stream_id FROM kafka_partitions WHERE topic=?", (name,))]
            self.store._delete_streams(db, ids)  # locks them: no WAL commit in between
            db.executemany("DELETE FROM kafka_producer_batches WHERE stream_id=?",
                           [(sid,) for sid in ids])
            db.execute("DELETE FROM kafka_partitions WHERE topic=?", (name,))
            db.execute("DELETE FROM kafka_topics WHERE name=?", (name,))

    async def delete_topic(self, name: str) -> None:
        """The topic, its partitions, their streams and chunks, and their producer state, in
        one transaction (committed group offsets: `delete_topic_offsets`)."""
        await self.store._run(self._delete_topic, name)

    def _set_configs(self, name: str, configs: dict[str, str]) -> None:
        self.store.db.execute("UPDATE kafka_topics SET configs=? WHERE name=?",
                              (json.dumps(configs), name))

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        await self.store._run(self._set_configs, name, configs)

    # -- producer ids ----------------------------------------------------------------------
    def _next_producer_id(self) -> int:
        with self.store._txn() as db:
            (value,) = db.execute("SELECT value FROM kafka_meta WHERE key='next_producer_id'"
                                  f"{self.store.for_update}").fetchone()
            db.execute("UPDATE kafka_meta SET value=? WHERE key='next_producer_id'",
                       (str(int(value) + 1),))
        return int(value)

    async def next_producer_id(self) -> int:
        """A producer id never handed out before (durable before it is returned)."""
        return await self.store._run(self._next_producer_id)
