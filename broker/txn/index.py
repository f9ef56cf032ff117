"""Per-partition transaction state on the log side: the open transactions (producer id ->
offset of its first transactional batch) and the aborted ranges (producer id, first offset,
offset of the abort marker), which give read_committed Fetch its last stable offset (LSO) and
its aborted_transactions.

It changes with the log: a transactional batch opens its producer's transaction when it is
appended (its offset is assigned then, so the LSO holds back from that moment), a marker
closes it when the marker is durable. Nothing here is written to the metadata store: when a
broker loads a partition that ever held transactional data, `rebuild` reads it from the log
(the data batches and markers are the truth; a marker is durable exactly when its commit is).

It also keeps, per producer, the highest coordinator epoch of the markers written here (from
the log when rebuilt: a marker's value carries it): a marker from an older coordinator of the
producer's transactional id is refused (TRANSACTION_COORDINATOR_FENCED), as Kafka's leaders do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.errors import ErrorCode, KafkaError
from broker.protocol.records import BatchHeader
from broker.txn.markers import ABORT, is_transactional, marker_of


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


@dataclass
class PartitionTxns:
    open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    aborted: list[AbortedTxn] = field(default_factory=list)  # in marker (last offset) order
    # producer id -> the highest coordinator epoch of its markers here
    coordinator_epochs: dict[int, int] = field(default_factory=dict)

    def began(self, producer_id: int, offset: int) -> None:
        self.open.setdefault(producer_id, offset)

    def ended(self, producer_id: int, kind: int, marker_offset: int) -> None:
        first = self.open.pop(producer_id, None)
        if first is not None and kind == ABORT:
            self.aborted.append(AbortedTxn(producer_id, first, marker_offset))

    def fence(self, producer_id: int, coordinator_epoch: int) -> None:
        """A marker of the producer from a coordinator of that epoch is about to be written:
        TRANSACTION_COORDINATOR_FENCED if a newer coordinator wrote one here (equal or
        higher: accepted and remembered)."""
        known = self.coordinator_epochs.get(producer_id, -1)
        if coordinator_epoch < known:
            raise KafkaError(ErrorCode.transaction_coordinator_fenced,
                             f"producer {producer_id}: coordinator epoch {coordinator_epoch},"
                             f" a marker of epoch {known} was written")
        self.coordinator_epochs[producer_id] = coordinator_epoch

    def lso(self, high_watermark: int) -> int:
        return min([high_watermark, *self.open.values()])

    def aborted_in(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions that may have records in [start, end)."""
        return [a for a in self.aborted if a.last_offset >= start and a.first_offset < end]

    def scan(self, data: bytes | bytearray | memoryview, headers: Iterable[BatchHeader]) -> None:
        """Rebuild from the log: feed every batch in offset order."""
        for h in headers:
            if not is_transactional(h) or h.producer_id < 0:
                continue
            if h.is_control:
                found = marker_of(data, h)
                if found is not None:
                    kind, coordinator_epoch = found
                    self.ended(h.producer_id, kind, h.base_offset)
                    self.coordinator_epochs[h.producer_id] = max(
                        coordinator_epoch, self.coordinator_epochs.get(h.producer_id, -1))
            else:
                self.began(h.producer_id, h.base_offset)

    def forget_before(self, log_start: int) -> None:
        """Drop aborted ranges that ended below the log start (nothing of them is served)."""
        self.aborted = [a for a in self.aborted if a.last_offset >= log_start]


class TxnIndex:
    """PartitionTxns of the partitions (by stream id) this broker serves."""

    def __init__(self) -> None:
        self.partitions: dict[int, PartitionTxns] = {}

    def get(self, stream_id: int) -> PartitionTxns | None:
        return self.partitions.get(stream_id)

    def appended(self, stream_id: int, h: BatchHeader, base_offset: int) -> None:
        """A data batch was appended at base_offset (its offsets are assigned)."""
        if is_transactional(h) and not h.is_control and h.producer_id >= 0:
            self.partitions.setdefault(stream_id, PartitionTxns()).began(
                h.producer_id, base_offset
            )

    def marker_durable(
        self, stream_id: int, producer_id: int, kind: int, marker_offset: int
    ) -> None:
        self.partitions.setdefault(stream_id, PartitionTxns()).ended(
            producer_id, kind, marker_offset
        )

    def fence(self, stream_id: int, producer_id: int, coordinator_epoch: int) -> None:
        """PartitionTxns.fence for the partition."""
        self.partitions.setdefault(stream_id, PartitionTxns()).fence(
            producer_id, coordinator_epoch)

    def lso(self, stream_id: int, high_watermark: int) -> int:
        p = self.partitions.get(stream_id)
        return high_watermark if p is None else p.lso(high_watermark)

    def aborted(self, stream_id: int, start: int, end: int) -> list[AbortedTxn]:
        p = self.partitions.get(stream_id)
        return [] if p is None else p.aborted_in(start, end)

    def drop(self, stream_id: int) -> None:
        self.partitions.pop(stream_id, None)

    def reset(self, stream_id: int) -> PartitionTxns:
        """A fresh state for the partition, for `PartitionTxns.scan` to fill from its log."""
        p = self.partitions[stream_id] = PartitionTxns()
        return p
