"""The broker's Kafka metadata (topics, configs, partitions -> streams, producer state, group
offsets, producer ids) in tables of its own, in the s3stream metadata store's database and on
its transaction plumbing; s3stream itself knows only streams, objects and chunks.

- .store: `KafkaMetadata`, wrapping an s3stream `MetadataStore`;
- .producers: producer rows written inside the WAL commit (a s3stream CommitAttachment);
- .offsets: committed group offsets;
- .txns: the transaction coordinator's state and pending transactional offsets;
- .schema: the tables and their migrations (component "broker.metadata");
- .model: the rows.
"""

from __future__ import annotations

from broker.metadata.model import (
    PRODUCER_BATCHES_KEPT,
    OffsetRow,
    PartitionRow,
    ProducerBatchRow,
    TopicRow,
)
from broker.metadata.producers import ProducerRows, producer_rows
from broker.metadata.schema import COMPONENT
from broker.metadata.store import KafkaMetadata, KafkaState, StreamsState
from broker.metadata.txns import PendingOffsetRow, TxnRow

__all__ = [
    "COMPONENT",
    "PRODUCER_BATCHES_KEPT",
    "KafkaMetadata",
    "KafkaState",
    "OffsetRow",
    "PartitionRow",
    "PendingOffsetRow",
    "ProducerBatchRow",
    "ProducerRows",
    "StreamsState",
    "TopicRow",
    "TxnRow",
    "producer_rows",
]
