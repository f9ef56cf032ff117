"""Freshness of a table topic, stage by stage, per partition (issue 18; seed 000's end-to-end
definition): a record is

  1. acknowledged to its producer (durable in the log: the partition's end offset),
  2. converted by the writer (read and turned into Arrow rows, or a dead letter),
  3. written as Parquet and committed to the catalog: one step here (the partition's worker
     writes the data files when the coordinator requests them, then the coordinator's catalog
     commit; tabletopic.coordinator), and
  4. visible to a reader: at once after 3 for any reader that loads the table afresh (the
     catalog commit is the visibility point; a reader holding an older snapshot sees it when it
     refreshes). Not timed apart from 3: the SQL catalog's commit is one database transaction
     moving the metadata pointer, done when the writer's commit returns, and every later
     `load_table` reads that pointer; a fresh load after it would time the load, not a delay
     of visibility (README, "Metrics and health").

Each stage's age is that of the oldest acknowledged record not yet through it (0 when none
waits): `ack_to_converted_seconds` and `ack_to_committed_seconds`; the writer's last commit
took `last_commit_seconds` (the catalog commit, on the coordinator's broker). Partitions are
those this broker writes (leads); on a cluster each broker reports its own.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from broker.errors import KafkaError

if TYPE_CHECKING:
    from tabletopic.writer import TableWriter


def freshness(w: TableWriter) -> dict[str, Any]:
    now = time.time()
    parts = []
    for p, s in sorted(w.parts.items()):
        try:
            _start, end = w.storage.offsets(w.topic, p)
            converted = acked_at(w, p, s.read_next, end)
            committed = acked_at(w, p, s.committed, end)
        except KafkaError:
            continue
        parts.append(
            {
                "partition": p,
                "acked_offset": end,
                "converted_offset": s.read_next,
                "committed_offset": s.committed,
                "ack_to_converted_seconds": _age(now, converted),
                "ack_to_committed_seconds": _age(now, committed),
            }
        )
    return {"last_commit_seconds": w.last_commit_seconds, "partitions": parts}


def acked_at(w: TableWriter, partition: int, offset: int, end: int) -> float | None:
    """When the record at `offset` was acknowledged; None when no record waits there."""
    return w.storage.commit_time(w.topic, partition, offset) if offset < end else None


def _age(now: float, acked: float | None) -> float:
    return round(max(0.0, now - acked), 3) if acked is not None else 0.0
