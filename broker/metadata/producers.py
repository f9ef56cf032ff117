"""Idempotent producer state in the metadata database: the rows go into the WAL commit's own
transaction (`ProducerRows`, a s3stream CommitAttachment), so a batch's sequence numbers are
durable exactly when its records are, and are taken back with them."""

from __future__ import annotations

from dataclasses import dataclass

from broker.metadata.model import PRODUCER_BATCHES_KEPT, ProducerBatchRow
from s3stream.log import ProducerBatch
from s3stream.metadata import ChunkRow
from s3stream.metadata.backend import Connection


@dataclass(frozen=True, slots=True)
class ProducerRows:
    """The idempotent batches of one WAL flush, written by its commit_object."""

    rows: list[ProducerBatchRow]

    def apply(self, db: Connection, live: set[int]) -> None:
        rows = [r for r in self.rows if r.stream_id in live]
        if not rows:
            return
        db.executemany(
            "INSERT INTO kafka_producer_batches VALUES (?,?,?,?,?,?,?)"
            " ON CONFLICT (stream_id, producer_id, base_offset) DO UPDATE SET"
            " epoch=excluded.epoch, first_seq=excluded.first_seq,"
            " last_seq=excluded.last_seq, last_offset=excluded.last_offset",
            [(r.stream_id, r.producer_id, r.epoch, r.first_seq, r.last_seq, r.base_offset,
              r.last_offset) for r in rows])
        db.executemany(
            "DELETE FROM kafka_producer_batches WHERE stream_id=? AND producer_id=? AND"
            " base_offset < (SELECT min(base_offset) FROM (SELECT base_offset FROM"
            " kafka_producer_batches WHERE stream_id=? AND producer_id=?"
            " ORDER BY base_offset DESC LIMIT ?) AS kept)",
            [(sid, pid, sid, pid, PRODUCER_BATCHES_KEPT)
             for sid, pid in {(r.stream_id, r.producer_id) for r in rows}])

    def undo(self, db: Connection, undone: list[ChunkRow]) -> None:
        db.executemany(
            "DELETE FROM kafka_producer_batches WHERE stream_id=? AND base_offset BETWEEN ? AND ?",
            [(c.stream_id, c.base_offset, c.last_offset) for c in undone])


def producer_rows(carried: list[tuple[int, ProducerBatch, int, int]]) -> list[ProducerRows]:
    """What a WAL flush's commit carries (LogStore.commit_attachments): its idempotent
    batches, (stream id, producer batch, base offset, last offset) each."""
    if not carried:
        return []
    return [ProducerRows([
        ProducerBatchRow(sid, p.producer_id, p.epoch, p.first_seq, p.last_seq, base, last)
        for sid, p, base, last in carried])]
