"""Idempotent producers: per-partition sequence bookkeeping (Kafka's producer state).

For each partition and producer id the last five batches are remembered (sequence range and
offsets). A batch is checked against the *pending* view (which includes batches still being
made durable, since a producer pipelines requests); the *durable* view follows the log's
commits and is what the pending view falls back to when a flush fails. The durable view is
also what the metadata store keeps (broker.metadata.producers, written by the WAL's own
commit), so the checks survive restarts.

Both views change synchronously with the log (`LogStore.on_durable` / `on_failed` call
`durable_append` / `failed_streams` at the commit or the failure itself): were the reset left
to future callbacks, a pipelined batch arriving in between would be checked against the failed
batches, accepted, and land before their retries (a log out of sequence order).
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from broker.errors import ErrorCode, KafkaError
from broker.metadata.model import PRODUCER_BATCHES_KEPT, ProducerBatchRow
from s3stream.log import ProducerBatch

SEQ_MODULUS = 2**31


@dataclass
class BatchMeta:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    durable: asyncio.Future[Any] | None = None  # pending: resolves when durable


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_KEPT))


@dataclass(frozen=True)
class Duplicate:
    """The batch was appended before: answer with the original offset once it is durable."""

    batch: BatchMeta


class ProducerStates:
    def __init__(self) -> None:
        self.pending: dict[int, dict[int, ProducerEntry]] = {}
        self.durable: dict[int, dict[int, ProducerEntry]] = {}

    def load(self, rows: list[ProducerBatchRow]) -> None:
        for r in rows:
            for view in (self.pending, self.durable):
                entry = view.setdefault(r.stream_id, {}).setdefault(
                    r.producer_id, ProducerEntry(r.epoch)
                )
                if r.epoch > entry.epoch:
                    entry.epoch = r.epoch
                    entry.batches.clear()
                entry.batches.append(
                    BatchMeta(r.first_seq, r.last_seq, r.base_offset, r.last_offset)
                )

    def check(
        self, stream_id: int, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> Duplicate | None:
        """Raise the Kafka error for a bad sequence or epoch; return Duplicate for a retry of a
        batch already appended; None when the batch is next in line."""
        entry = self.pending.get(stream_id, {}).get(producer_id)
        if entry is None:
            if first_seq != 0:
                raise KafkaError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {producer_id}: first sequence {first_seq}, expected 0",
                )
            return None
        if epoch < entry.epoch:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"producer {producer_id}: epoch {epoch} is older than {entry.epoch}",
            )
        if epoch > entry.epoch:
            if first_seq != 0:
                raise KafkaError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {producer_id}: new epoch {epoch} must start at 0",
                )
            return None
        for b in entry.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return Duplicate(b)
        expected = 0 if not entry.batches else (entry.batches[-1].last_seq + 1) % SEQ_MODULUS
        if first_seq != expected:
            raise KafkaError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {producer_id}: sequence {first_seq}, expected {expected}",
            )
        return None

    def appended(self, stream_id: int, producer_id: int, epoch: int, batch: BatchMeta) -> None:
        _record(self.pending, stream_id, producer_id, epoch, batch)

    def made_durable(self, stream_id: int, producer_id: int, epoch: int, batch: BatchMeta) -> None:
        _record(
            self.durable,
            stream_id,
            producer_id,
            epoch,
            BatchMeta(batch.first_seq, batch.last_seq, batch.base_offset, batch.last_offset),
        )

    def durable_append(self, stream_id: int, p: ProducerBatch, base: int, last: int) -> None:
        """The log committed an idempotent batch."""
        self.made_durable(
            stream_id, p.producer_id, p.epoch, BatchMeta(p.first_seq, p.last_seq, base, last)
        )

    def failed(self, stream_id: int) -> None:
        """A flush failed: every in-flight batch of the stream failed with it."""
        self.pending[stream_id] = copy.deepcopy(self.durable.get(stream_id, {}))

    def failed_streams(self, stream_ids: set[int]) -> None:
        for sid in stream_ids:
            self.failed(sid)

    def drop_stream(self, stream_id: int) -> None:
        self.pending.pop(stream_id, None)
        self.durable.pop(stream_id, None)


def _record(
    view: dict[int, dict[int, ProducerEntry]],
    stream_id: int,
    producer_id: int,
    epoch: int,
    batch: BatchMeta,
) -> None:
    entry = view.setdefault(stream_id, {}).get(producer_id)
    if entry is None or epoch > entry.epoch:
        entry = view[stream_id][producer_id] = ProducerEntry(epoch)
    entry.batches.append(batch)
