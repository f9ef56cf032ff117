"""The Kafka rows the broker keeps in the metadata database (see broker.metadata)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

PRODUCER_BATCHES_KEPT = 5  # per partition and producer, like Kafka


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """A partition and the s3stream stream that holds its log."""

    topic: str
    partition: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class ProducerBatchRow:
    """One idempotent batch of a partition (by its stream): what sequence checks after a
    restart need."""

    stream_id: int
    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class OffsetRow:
    group_id: str
    topic: str
    partition: int
    committed_offset: int
    leader_epoch: int
    metadata: str | None
    commit_ms: int
