"""The transaction coordinator's durable state (broker.txn): one row per transactional id,
the TxnOffsetCommit offsets pending until their transaction ends, and the partitions that
ever took part in a transaction (see .schema, migration 3), and each id's coordinator epoch
(migration 6), bumped when a broker takes the id over (`take_txns`, `take_txn`).

Every method is one metadata transaction: the state written when a transaction ends and the
move of its pending offsets into the committed group offsets land together or not at all.
A state row is only written over the version its writer read (`update_ms`, strictly
increasing per row): a coordinator acting on a stale copy (another broker took the id over and
changed it) gets TxnConflictError and writes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.metadata.model import OffsetRow
from s3stream.metadata import MetadataStore
from s3stream.metadata.base import marks


class TxnConflictError(Exception):
    """The transactional id's row is not the version the writer read (or, for a new one,
    exists already): another coordinator changed it."""


@dataclass(frozen=True, slots=True)
class TxnRow:
    transactional_id: str
    producer_id: int
    epoch: int
    state: str
    partitions: tuple[tuple[str, int], ...]
    groups: tuple[str, ...]
    timeout_ms: int
    start_ms: int
    update_ms: int
    last_epoch: int = -1  # the epoch before a bump that aborted an expired transaction
    # bumped by each broker taking the id over; its markers carry it (never written by
    # save_txn / end_txn over an existing row)
    coordinator_epoch: int = 0


@dataclass(frozen=True, slots=True)
class PendingOffsetRow:
    """A TxnOffsetCommit offset, visible to groups only once its transaction commits."""

    transactional_id: str
    group_id: str
    topic: str
    partition: int
    committed_offset: int
    leader_epoch: int
    metadata: str | None


def _values(r: TxnRow) -> tuple[object, ...]:
    return (r.transactional_id, r.producer_id, r.epoch, r.state,
            json.dumps([list(p) for p in r.partitions]), json.dumps(list(r.groups)),
            r.timeout_ms, r.start_ms, r.update_ms, r.last_epoch)


_COLUMNS = ("SELECT transactional_id, producer_id, epoch, state, partitions, groups, timeout_ms,"
            " start_ms, update_ms, last_epoch, coordinator_epoch FROM kafka_transactions")


def _row(r: tuple[Any, ...]) -> TxnRow:
    tid, pid, epoch, state, parts, groups, timeout, start, update, last, cepoch = r
    return TxnRow(tid, pid, epoch, state, tuple((str(t), int(p)) for t, p in json.loads(parts)),
                  tuple(json.loads(groups)), timeout, start, update, last, cepoch)


class TxnStateMixin:
    store: MetadataStore

    def _load_txns(
        self, take: Callable[[str], bool] | None = None
    ) -> tuple[list[TxnRow], list[PendingOffsetRow]]:
        with self.store._txn(read_only=take is None) as db:
            if take is not None:
                taken = [(t,) for (t,) in db.execute(
                    "SELECT transactional_id FROM kafka_transactions") if take(str(t))]
                db.executemany("UPDATE kafka_transactions SET"
                               " coordinator_epoch=coordinator_epoch+1"
                               " WHERE transactional_id=?", taken)
            rows = [_row(r) for r in db.execute(_COLUMNS)]
            pending = [PendingOffsetRow(*r) for r in db.execute(
                "SELECT transactional_id, group_id, topic, partition, committed_offset,"
                " leader_epoch, metadata FROM kafka_txn_offsets")]
        return rows, pending

    async def load_txns(self) -> tuple[list[TxnRow], list[PendingOffsetRow]]:
        """Every transactional id's state and every pending transactional offset."""
        return await self.store._run(self._load_txns)

    async def take_txns(
        self, take: Callable[[str], bool]
    ) -> tuple[list[TxnRow], list[PendingOffsetRow]]:
        """As load_txns, and in the same metadata transaction the coordinator epoch of every
        id for which `take` is true is bumped (the rows returned carry the new one): this
        broker takes those ids over. `take` runs in the store's thread."""
        return await self.store._run(self._load_txns, take)

    def _write(self, row: TxnRow, read_version: int | None) -> None:
        db = self.store.db
        if read_version is None:
            written = db.execute(
                "INSERT INTO kafka_transactions(transactional_id, producer_id, epoch, state,"
                " partitions, groups, timeout_ms, start_ms, update_ms, last_epoch,"
                " coordinator_epoch) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (transactional_id) DO NOTHING",
                (*_values(row), row.coordinator_epoch))
        else:
            written = db.execute(
                "UPDATE kafka_transactions SET producer_id=?, epoch=?, state=?, partitions=?,"
                " groups=?, timeout_ms=?, start_ms=?, update_ms=?, last_epoch=?"
                " WHERE transactional_id=? AND update_ms=?",
                (*_values(row)[1:], row.transactional_id, read_version))
        if written.rowcount != 1:
            raise TxnConflictError(f"transactional id {row.transactional_id!r} changed")

    def _load_txn(self, tid: str, take: bool = False) -> TxnRow | None:
        with self.store._txn(read_only=not take) as db:
            if take:
                db.execute("UPDATE kafka_transactions SET coordinator_epoch=coordinator_epoch+1"
                           " WHERE transactional_id=?", (tid,))
            found = db.execute(_COLUMNS + " WHERE transactional_id=?", (tid,)).fetchall()
        for r in found:
            return _row(tuple(r))
        return None

    async def load_txn(self, tid: str) -> TxnRow | None:
        return await self.store._run(self._load_txn, tid)

    async def take_txn(self, tid: str) -> TxnRow | None:
        """As load_txn, bumping the id's coordinator epoch in the same metadata transaction
        (this broker takes the id over)."""
        return await self.store._run(self._load_txn, tid, True)

    def _save_txn(
        self, row: TxnRow, new_partitions: list[tuple[str, int]], read_version: int | None
    ) -> None:
        with self.store._txn() as db:
            self._write(row, read_version)
            for topic, partition in new_partitions:
                db.execute(
                    "INSERT INTO kafka_txn_streams(stream_id) SELECT stream_id FROM"
                    " kafka_partitions WHERE topic=? AND partition=?"
                    " ON CONFLICT (stream_id) DO NOTHING", (topic, partition))

    async def save_txn(
        self, row: TxnRow, new_partitions: list[tuple[str, int]], read_version: int | None
    ) -> None:
        """Write a transactional id's state over the version read (None: a new id);
        `new_partitions` are remembered as partitions holding transactional data (durable
        before any of it can be appended)."""
        await self.store._run(self._save_txn, row, new_partitions, read_version)

    def _add_txn_offsets(self, rows: list[PendingOffsetRow]) -> None:
        with self.store._txn() as db:
            db.executemany(
                "INSERT INTO kafka_txn_offsets VALUES (?,?,?,?,?,?,?) ON CONFLICT"
                " (transactional_id, group_id, topic, partition) DO UPDATE SET"
                " committed_offset=excluded.committed_offset,"
                " leader_epoch=excluded.leader_epoch, metadata=excluded.metadata",
                [(r.transactional_id, r.group_id, r.topic, r.partition, r.committed_offset,
                  r.leader_epoch, r.metadata) for r in rows])

    async def add_txn_offsets(self, rows: list[PendingOffsetRow]) -> None:
        await self.store._run(self._add_txn_offsets, rows)

    def _end_txn(self, row: TxnRow, commit: bool, read_version: int) -> list[OffsetRow]:
        now = int(time.time() * 1000)
        with self.store._txn() as db:
            self._write(row, read_version)
            pending = [PendingOffsetRow(*r) for r in db.execute(
                "SELECT transactional_id, group_id, topic, partition, committed_offset,"
                " leader_epoch, metadata FROM kafka_txn_offsets WHERE transactional_id=?",
                (row.transactional_id,))]
            moved = [OffsetRow(p.group_id, p.topic, p.partition, p.committed_offset,
                               p.leader_epoch, p.metadata, now) for p in pending] if commit else []
            db.executemany(
                "INSERT INTO kafka_group_offsets VALUES (?,?,?,?,?,?,?) ON CONFLICT"
                " (group_id, topic, partition) DO UPDATE SET"
                " committed_offset=excluded.committed_offset,"
                " leader_epoch=excluded.leader_epoch, metadata=excluded.metadata,"
                " commit_ms=excluded.commit_ms",
                [(r.group_id, r.topic, r.partition, r.committed_offset, r.leader_epoch,
                  r.metadata, r.commit_ms) for r in moved])
            db.execute("DELETE FROM kafka_txn_offsets WHERE transactional_id=?",
                       (row.transactional_id,))
        return moved

    async def end_txn(self, row: TxnRow, commit: bool, read_version: int) -> list[OffsetRow]:
        """Write the transaction's completed state (over the version read) and, when it
        committed, move its pending offsets into the committed group offsets (returned); on
        abort they are dropped."""
        return await self.store._run(self._end_txn, row, commit, read_version)

    def _txn_streams(self, stream_ids: list[int]) -> set[int]:
        if not stream_ids:
            return set()
        return {int(s) for (s,) in self.store.db.execute(
            f"SELECT stream_id FROM kafka_txn_streams WHERE stream_id IN"
            f" ({marks(len(stream_ids))})", stream_ids)}

    async def txn_streams(self, stream_ids: list[int]) -> set[int]:
        """Those of `stream_ids` that ever held transactional data."""
        return await self.store._run(self._txn_streams, stream_ids)
