"""Committed consumer-group offsets (the SQL half of the group coordinator's OffsetStore)."""

from __future__ import annotations

from broker.metadata.model import OffsetRow
from s3stream.metadata import MetadataStore
from s3stream.metadata.backend import Connection


class GroupOffsetsMixin:
    store: MetadataStore

    def _load_offsets(self) -> list[OffsetRow]:
        return [OffsetRow(*r) for r in self.store.db.execute(
            "SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata,"
            " commit_ms FROM kafka_group_offsets")]

    async def load_offsets(self) -> list[OffsetRow]:
        return await self.store._run(self._load_offsets)

    @staticmethod
    def write_offsets(db: Connection, rows: list[OffsetRow]) -> None:
        """Upsert committed offsets (inside the caller's transaction)."""
        db.executemany(
            "INSERT INTO kafka_group_offsets VALUES (?,?,?,?,?,?,?) ON CONFLICT"
            " (group_id, topic, partition) DO UPDATE SET"
            " committed_offset=excluded.committed_offset,"
            " leader_epoch=excluded.leader_epoch, metadata=excluded.metadata,"
            " commit_ms=excluded.commit_ms",
            [(r.group_id, r.topic, r.partition, r.committed_offset, r.leader_epoch,
              r.metadata, r.commit_ms) for r in rows])

    @staticmethod
    def read_group_offsets(db: Connection, group_id: str) -> list[OffsetRow]:
        """One group's committed offsets (inside the caller's transaction)."""
        return [OffsetRow(*r) for r in db.execute(
            "SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata,"
            " commit_ms FROM kafka_group_offsets WHERE group_id=?", (group_id,))]

    def _commit_offsets(self, rows: list[OffsetRow]) -> None:
        with self.store._txn() as db:
            self.write_offsets(db, rows)

    async def commit_offsets(self, rows: list[OffsetRow], epoch: int | None = None) -> None:
        """Store committed offsets durably, all or none (unfenced: `epoch` is not checked
        here; a broker of a cluster commits through broker.cluster.groupguard)."""
        await self.store._run(self._commit_offsets, rows)

    def _take_group(self, group_id: str) -> list[OffsetRow]:
        with self.store._txn(read_only=True) as db:
            return self.read_group_offsets(db, group_id)

    async def take_group(self, group_id: str) -> tuple[int | None, list[OffsetRow]]:
        """The group's committed offsets; no coordinator epoch (not fenced)."""
        return None, await self.store._run(self._take_group, group_id)

    @staticmethod
    def remove_offsets(db: Connection, group_id: str, keys: list[tuple[str, int]] | None) -> None:
        """Delete some (None: all) of a group's offsets (inside the caller's transaction)."""
        if keys is None:
            db.execute("DELETE FROM kafka_group_offsets WHERE group_id=?", (group_id,))
        else:
            db.executemany("DELETE FROM kafka_group_offsets WHERE group_id=? AND topic=?"
                           " AND partition=?", [(group_id, t, p) for t, p in keys])

    def _delete_offsets(self, group_id: str, keys: list[tuple[str, int]] | None) -> None:
        with self.store._txn() as db:
            self.remove_offsets(db, group_id, keys)

    async def delete_offsets(
        self, group_id: str, keys: list[tuple[str, int]] | None, epoch: int | None = None
    ) -> None:
        """Delete some (or, with None, all) of a group's committed offsets (unfenced)."""
        await self.store._run(self._delete_offsets, group_id, keys)

    def _delete_topic_offsets(self, topic: str) -> None:
        self.store.db.execute("DELETE FROM kafka_group_offsets WHERE topic=?", (topic,))

    async def delete_topic_offsets(self, topic: str) -> None:
        await self.store._run(self._delete_topic_offsets, topic)

    async def holds(self, group_id: str, epoch: int | None) -> bool:
        """Unfenced: this broker alone serves its groups."""
        return True
