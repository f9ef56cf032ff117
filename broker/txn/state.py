"""A transactional id's coordinator state (Kafka's TransactionMetadata) and where it is kept.

States, as Kafka names them (DescribeTransactions shows these names):
  Empty -> Ongoing (AddPartitionsToTxn / AddOffsetsToTxn)
  Ongoing -> PrepareCommit | PrepareAbort (EndTxn, a timeout, a fencing InitProducerId)
  Prepare* -> Complete* once every partition has its marker
  Complete* -> Ongoing (the next transaction) or Empty.
A Prepare* state is written before any marker, so a coordinator that dies between the markers
finishes them when it starts again (or another broker taking the coordinator over does).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from broker.metadata.model import OffsetRow
from broker.metadata.txns import PendingOffsetRow, TxnRow

MAX_EPOCH = 2**15 - 1  # an epoch at this value cannot be bumped: a new producer id is taken
MAX_TIMEOUT_MS = 900_000  # transaction.max.timeout.ms


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class TxnMeta:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    start_ms: int = -1  # when the open transaction began
    update_ms: int = field(default_factory=now_ms)
    last_epoch: int = -1  # the epoch before a bump that aborted its expired transaction
    coordinator_epoch: int = 0  # taken with the id (TxnBackend.take_txns); markers carry it

    def row(self) -> TxnRow:
        return TxnRow(self.transactional_id, self.producer_id, self.epoch, self.state.value,
                      tuple(sorted(self.partitions)), tuple(sorted(self.groups)),
                      self.timeout_ms, self.start_ms, self.update_ms, self.last_epoch,
                      self.coordinator_epoch)

    @classmethod
    def of(cls, r: TxnRow) -> TxnMeta:
        return cls(r.transactional_id, r.producer_id, r.epoch, r.timeout_ms, TxnState(r.state),
                   set(r.partitions), set(r.groups), r.start_ms, r.update_ms, r.last_epoch,
                   r.coordinator_epoch)

    def expired(self, now: int) -> bool:
        return self.state == TxnState.ONGOING and now >= self.start_ms + self.timeout_ms


class TxnBackend(Protocol):
    """Where the coordinator keeps its state durably (broker.metadata.KafkaMetadata); each
    call is one metadata transaction, durable on return. A write names the version
    (update_ms) it read and raises TxnConflictError if the row is no longer that version."""

    async def load_txns(self) -> tuple[list[TxnRow], list[PendingOffsetRow]]: ...

    async def take_txns(
        self, take: Callable[[str], bool]
    ) -> tuple[list[TxnRow], list[PendingOffsetRow]]:
        """load_txns, bumping the coordinator epoch of the ids `take` accepts in the same
        metadata transaction (this broker takes them over)."""
        ...

    async def load_txn(self, tid: str) -> TxnRow | None: ...

    async def take_txn(self, tid: str) -> TxnRow | None:
        """load_txn, bumping the id's coordinator epoch in the same metadata transaction."""
        ...

    async def save_txn(
        self, row: TxnRow, new_partitions: list[tuple[str, int]], read_version: int | None
    ) -> None: ...

    async def add_txn_offsets(self, rows: list[PendingOffsetRow]) -> None: ...

    async def end_txn(self, row: TxnRow, commit: bool, read_version: int) -> list[OffsetRow]: ...
