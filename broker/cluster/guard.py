"""Fencing: every change a broker makes to its partitions' logs (WAL commit, compaction,
cleaning, retention) carries a `LeaderGuard`, checked inside the change's own transaction
(an s3stream CommitAttachment): this broker process still holds a live lease, and leads each
stream with the epoch it held when the change started. Otherwise the transaction is rolled
back with StreamsFencedError naming the refused streams: a deposed or paused broker can upload
objects but never make them part of the log."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from s3stream.metadata import ChunkRow, StreamsFencedError
from s3stream.metadata.backend import Connection
from s3stream.metadata.base import marks


@dataclass(frozen=True)
class LeaderGuard:
    node_id: int
    incarnation: str
    epochs: Mapping[int, int]  # stream id -> the leader epoch this broker holds
    for_update: str  # the dialect's row lock: a leader change waits for this commit

    def apply(self, db: Connection, live: set[int]) -> None:
        ids = sorted(live)
        if not ids:
            return
        row = db.execute("SELECT incarnation, lease_expires_ms FROM kafka_brokers"
                         " WHERE node_id=?", (self.node_id,)).fetchone()
        if row is None or row[0] != self.incarnation or row[1] <= time.time() * 1000:
            raise StreamsFencedError(set(ids), f"broker {self.node_id}: lease expired or"
                                     " registered again by another process")
        leaders = {int(s): (int(n), int(e)) for s, n, e in db.execute(
            "SELECT stream_id, leader, leader_epoch FROM kafka_partitions WHERE stream_id IN"
            f" ({marks(len(ids))}) ORDER BY stream_id{self.for_update}", ids)}
        fenced = {s for s in ids if self.epochs.get(s) is None
                  or leaders.get(s) != (self.node_id, self.epochs[s])}
        if fenced:
            raise StreamsFencedError(fenced, f"broker {self.node_id} is not the leader (or not"
                                     f" at the epoch it holds) of streams {sorted(fenced)}")

    def undo(self, db: Connection, undone: list[ChunkRow]) -> None:
        return None  # a guard writes nothing

