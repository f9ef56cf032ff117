"""Per-partition transaction state on the log side: the open transactions (producer id ->
offset of its first transactional batch) and the aborted ranges (producer id, first offset,
offset of the abort marker), which give read_committed Fetch its last stable offset (LSO) and
its aborted_transactions.

It changes with the log: a transactional batch opens its producer's transaction when it is
appended (its offset is assigned then, so the LSO holds back from that moment), a marker
closes it when the marker is durable. Nothing here is written to the metadata store: when a
broker loads a partition that ever held transactional data, `rebuild` reads it from the log
(the data batches and markers are the truth; a marker is durable exactly when its commit is).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.protocol.records import BatchHeader
from broker.txn.markers import ABORT, is_transactional, marker_type


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


@dataclass
class PartitionTxns:
    open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    aborted: list[AbortedTxn] = field(default_factory=list)  # in marker (last offset) order

    def began(self, producer_id: int, offset: int) -> None:
        self.open.setdefault(producer_id, offset)

    def ended(self, producer_id: int, kind: int, marker_offset: int) -> None:
        first = self.open.pop(producer_id, None)
        if first is not None and kind == ABORT:
            self.aborted.append(AbortedTxn(producer_id, first, marker_offset))

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
                kind = marker_type(data, h)
                if kind is not None:
                    self.ended(h.producer_id, kind, h.base_offset)
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
