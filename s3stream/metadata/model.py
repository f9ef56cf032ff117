"""What the metadata store hands out and raises: row types and errors."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import ClassVar

PRODUCER_BATCHES_KEPT = 5  # per stream and producer, like Kafka


class MetadataError(Exception):
    """A metadata operation failed and changed nothing. `retriable`: the same call may work
    if made again later (the database was unreachable), as opposed to a refusal."""

    retriable: ClassVar[bool] = False


class OffsetConflictError(MetadataError):
    """A commit's base offset is not the stream's end offset: someone else wrote, or a retry."""


class MetadataUnavailableError(MetadataError):
    """The database connection was lost or could not be made; the call did not take effect.
    The store reconnects on its next call."""

    retriable = True


class CommitInDoubtError(MetadataUnavailableError):
    """The connection was lost while COMMIT was on its way: the transaction may or may not
    have committed. The caller may treat it as not done: on reconnecting, the store asks the
    server and undoes what did commit, for the operations that say so in their docstring."""


class TransactionRetryError(MetadataError):
    """The database aborted a transaction to break a deadlock or a serialization conflict;
    the store runs it again a few times before letting this through."""

    retriable = True


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class StreamRow:
    stream_id: int
    topic: str
    partition: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class ChunkRow:
    stream_id: int
    base_offset: int
    last_offset: int
    object_id: int
    position: int
    length: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class ProducerBatchRow:
    """One idempotent batch of a stream: what sequence checks after a restart need."""

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


@dataclass(frozen=True, slots=True)
class ObjectRow:
    object_id: int
    key: str
    size: int
    kind: str
    created_ms: int
