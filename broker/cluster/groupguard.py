"""Fencing of offset commits: a group's committed offsets are written only by the broker that
took the group over last, checked inside the commit's own transaction (as the WAL's
LeaderGuard checks a partition's leader epoch).

`kafka_group_coordinators(group_id, node_id, epoch)` (broker.metadata.schema, migration 5):
- a broker *takes* a group (before it serves it: the first request after the group is placed
  on it) in one transaction: it checks that the placement rule (broker.cluster.coordinators,
  the rendezvous hash over the brokers the database has live) names it, bumps the group's
  coordinator epoch (the row lock waits for a commit in flight of the previous coordinator)
  and reads the group's committed offsets;
- every OffsetCommit's transaction (and OffsetDelete's, DeleteGroups') reads the group's row
  (locked: a take-over waits for it) and writes only if it still names this broker at the
  epoch it took; otherwise the commit is refused with NOT_COORDINATOR, nothing written, and
  the client finds the new coordinator.

So a commit is either in what the new coordinator read when it took the group, or refused:
never lost silently, and the group's offsets never go back to an older coordinator's view.
The check is a statement in the commit's transaction, not a round trip of its own.
"""

from __future__ import annotations

import time

from broker.cluster.coordinators import slot_of, slot_owner
from broker.cluster.node import ClusterNode
from broker.errors import ErrorCode, KafkaError
from broker.metadata import KafkaMetadata, OffsetRow
from s3stream.metadata.backend import Connection


def take(db: Connection, node_id: int, incarnation: str, group_id: str, now_ms: int) -> int:
    """Take the group over for this broker process (inside a write transaction): the new
    coordinator epoch. NOT_COORDINATOR when the database's live brokers place it elsewhere
    (or this process's lease lapsed)."""
    rows = db.execute("SELECT node_id, incarnation, port, lease_expires_ms FROM"
                      " kafka_brokers").fetchall()
    live = sorted(int(n) for n, _, port, exp in rows if int(exp) > now_ms and int(port) > 0)
    mine = any(int(n) == node_id and inc == incarnation and int(exp) > now_ms
               for n, inc, _, exp in rows)
    owner = slot_owner(slot_of(group_id), live or [node_id])
    if not mine or owner != node_id:
        raise KafkaError(ErrorCode.not_coordinator, f"group {group_id} is placed on broker"
                         f" {owner}, not {node_id}")
    db.execute("INSERT INTO kafka_group_coordinators(group_id, node_id, epoch) VALUES (?,?,1)"
               " ON CONFLICT (group_id) DO UPDATE SET node_id=excluded.node_id,"
               " epoch=kafka_group_coordinators.epoch+1", (group_id, node_id))
    (epoch,) = db.execute("SELECT epoch FROM kafka_group_coordinators WHERE group_id=?",
                          (group_id,)).fetchone()
    return int(epoch)


def check(db: Connection, node_id: int, group_id: str, epoch: int | None,
          for_update: str) -> None:
    """Refuse (NOT_COORDINATOR) unless this broker holds the group at `epoch`; locks the
    group's row until the transaction ends."""
    row = db.execute("SELECT node_id, epoch FROM kafka_group_coordinators WHERE group_id=?"
                     f"{for_update}", (group_id,)).fetchone()
    if epoch is None or row is None or (int(row[0]), int(row[1])) != (node_id, epoch):
        held = "nobody" if row is None else f"broker {row[0]} at epoch {row[1]}"
        raise KafkaError(ErrorCode.not_coordinator, f"group {group_id} is coordinated by"
                         f" {held} (broker {node_id} took it at epoch {epoch})")


class FencedGroupOffsets:
    """The group offset backend (broker.groups.offsets.GroupOffsetBackend) of a broker of a
    cluster: committed offsets in the metadata database, commits fenced as above."""

    def __init__(self, kafka: KafkaMetadata, node: ClusterNode) -> None:
        self.kafka = kafka
        self.node = node

    async def load_offsets(self) -> list[OffsetRow]:
        return await self.kafka.load_offsets()

    def _delete(self, group_id: str, keys: list[tuple[str, int]] | None,
                epoch: int | None) -> None:
        with self.node.store._txn() as db:
            check(db, self.node.node_id, group_id, epoch, self.node.store.for_update)
            self.kafka.remove_offsets(db, group_id, keys)

    async def delete_offsets(
        self, group_id: str, keys: list[tuple[str, int]] | None, epoch: int | None = None
    ) -> None:
        await self.node.store._run(self._delete, group_id, keys, epoch)

    async def delete_topic_offsets(self, topic: str) -> None:
        await self.kafka.delete_topic_offsets(topic)

    def _take(self, group_id: str) -> tuple[int | None, list[OffsetRow]]:
        me = self.node.me
        with self.node.store._txn() as db:
            epoch = take(db, me.node_id, me.incarnation, group_id, int(time.time() * 1000))
            return epoch, self.kafka.read_group_offsets(db, group_id)

    async def take_group(self, group_id: str) -> tuple[int | None, list[OffsetRow]]:
        return await self.node.store._run(self._take, group_id)

    def _commit(self, rows: list[OffsetRow], epoch: int | None) -> None:
        with self.node.store._txn() as db:
            for group_id in sorted({r.group_id for r in rows}):
                check(db, self.node.node_id, group_id, epoch, self.node.store.for_update)
            self.kafka.write_offsets(db, rows)

    async def commit_offsets(self, rows: list[OffsetRow], epoch: int | None = None) -> None:
        await self.node.store._run(self._commit, rows, epoch)

    def _holds(self, group_id: str, epoch: int | None) -> bool:
        with self.node.store._txn(read_only=True) as db:
            row = db.execute("SELECT node_id, epoch FROM kafka_group_coordinators WHERE"
                             " group_id=?", (group_id,)).fetchone()
        return (epoch is not None and row is not None
                and (int(row[0]), int(row[1])) == (self.node.node_id, epoch))

    async def holds(self, group_id: str, epoch: int | None) -> bool:
        """Whether the group's row still names this broker at `epoch` (OffsetFetch's check:
        a read, so a commit of the new coordinator landing just after it is not seen, as
        with any read; what it closes is answering long after a take-over from this
        broker's stale view)."""
        return await self.node.store._run(self._holds, group_id, epoch)
