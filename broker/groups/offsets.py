"""Committed offsets: an in-memory view over the metadata store, written through durably."""

from __future__ import annotations

import time
from typing import Protocol

from broker.errors import ErrorCode, KafkaError
from broker.metadata.model import OffsetRow

MAX_METADATA_BYTES = 4096  # offset.metadata.max.bytes


class GroupOffsetBackend(Protocol):
    """Where a storage engine keeps committed offsets (the s3stream engine: its Kafka
    metadata, broker.metadata; the null engine: memory). Each call is all or none, durable
    on return."""

    async def load_offsets(self) -> list[OffsetRow]: ...

    async def take_group(self, group_id: str) -> tuple[int | None, list[OffsetRow]]:
        """Become the group's coordinator: the coordinator epoch taken (None: the backend
        does not fence commits) and the group's committed offsets, read after taking it (a
        commit its previous coordinator made is in them, a later one is refused). Raises
        KafkaError NOT_COORDINATOR when the group is placed on another broker."""
        ...

    async def commit_offsets(self, rows: list[OffsetRow], epoch: int | None = None) -> None:
        """Rows of one group. A fencing backend writes them only if this broker still holds
        the group at `epoch` (the one take_group returned), checked in the write's own
        transaction; otherwise KafkaError NOT_COORDINATOR and nothing is written."""
        ...

    async def delete_offsets(
        self, group_id: str, keys: list[tuple[str, int]] | None, epoch: int | None = None
    ) -> None:
        """Fenced like commit_offsets."""
        ...

    async def delete_topic_offsets(self, topic: str) -> None: ...

    async def holds(self, group_id: str, epoch: int | None) -> bool:
        """Whether this broker still coordinates the group at `epoch` (a read, no lock): what
        an OffsetFetch checks before answering from this broker's view. Always True for a
        backend that does not fence."""
        ...


class MemoryGroupOffsets:
    """Committed offsets kept in memory only (engines that keep nothing across restarts)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, int], OffsetRow] = {}

    async def load_offsets(self) -> list[OffsetRow]:
        return list(self.rows.values())

    async def take_group(self, group_id: str) -> tuple[int | None, list[OffsetRow]]:
        return None, [r for r in self.rows.values() if r.group_id == group_id]

    async def commit_offsets(self, rows: list[OffsetRow], epoch: int | None = None) -> None:
        for r in rows:
            self.rows[(r.group_id, r.topic, r.partition)] = r

    async def delete_offsets(
        self, group_id: str, keys: list[tuple[str, int]] | None, epoch: int | None = None
    ) -> None:
        for k in [k for k in self.rows if k[0] == group_id]:
            if keys is None or (k[1], k[2]) in keys:
                del self.rows[k]

    async def delete_topic_offsets(self, topic: str) -> None:
        for k in [k for k in self.rows if k[1] == topic]:
            del self.rows[k]

    async def holds(self, group_id: str, epoch: int | None) -> bool:
        return True


class OffsetStore:
    def __init__(self, meta: GroupOffsetBackend) -> None:
        self.meta = meta
        self.offsets: dict[str, dict[tuple[str, int], OffsetRow]] = {}
        self.epochs: dict[str, int] = {}  # group -> coordinator epoch taken (fencing backends)
        # groups whose commit was refused (another broker took them over): to unload, and to
        # take over again should they be placed here (broker.handlers.coordination.here)
        self.lost: set[str] = set()

    async def load(self) -> None:
        for r in await self.meta.load_offsets():
            self.offsets.setdefault(r.group_id, {})[(r.topic, r.partition)] = r

    async def reload(self, group_id: str) -> None:
        """Take the group over (its coordinator epoch) and read its committed offsets again
        (another broker may have coordinated it). NOT_COORDINATOR: placed elsewhere."""
        epoch, rows = await self.meta.take_group(group_id)
        self.offsets.pop(group_id, None)
        for r in rows:
            self.offsets.setdefault(group_id, {})[(r.topic, r.partition)] = r
        if epoch is None:
            self.epochs.pop(group_id, None)
        else:
            self.epochs[group_id] = epoch
        self.lost.discard(group_id)

    def _refused(self, group_id: str, e: KafkaError) -> None:
        if e.code == ErrorCode.not_coordinator:
            self.epochs.pop(group_id, None)
            self.lost.add(group_id)

    async def commit(
        self, group_id: str, entries: list[tuple[str, int, int, int, str | None]]
    ) -> None:
        """entries: (topic, partition, offset, leader epoch, metadata). Durable on return.
        NOT_COORDINATOR (nothing written) when another broker took the group over since
        this one did; the group must be taken again (`reload`) before it commits here."""
        now = int(time.time() * 1000)
        rows = [OffsetRow(group_id, t, p, o, e, md, now) for t, p, o, e, md in entries]
        try:
            await self.meta.commit_offsets(rows, self.epochs.get(group_id))
        except KafkaError as e:
            self._refused(group_id, e)
            raise
        group = self.offsets.setdefault(group_id, {})
        for r in rows:
            group[(r.topic, r.partition)] = r

    async def still_held(self, group_id: str) -> bool:
        """Whether this broker still coordinates the group (a fencing backend reads the
        group's coordinator row): False means another broker took it over since this one
        did; the group is then lost here, as after a refused commit, and this broker's
        offsets of it must not be served (they may be older than the new coordinator's)."""
        if await self.meta.holds(group_id, self.epochs.get(group_id)):
            return True
        self._refused(group_id, KafkaError(ErrorCode.not_coordinator, "taken over"))
        return False

    def get(self, group_id: str, topic: str, partition: int) -> OffsetRow | None:
        return self.offsets.get(group_id, {}).get((topic, partition))

    def of_group(self, group_id: str) -> dict[tuple[str, int], OffsetRow]:
        return self.offsets.get(group_id, {})

    async def delete(self, group_id: str, keys: list[tuple[str, int]] | None) -> None:
        """Fenced like `commit` (NOT_COORDINATOR: nothing deleted)."""
        try:
            await self.meta.delete_offsets(group_id, keys, self.epochs.get(group_id))
        except KafkaError as e:
            self._refused(group_id, e)
            raise
        if keys is None:
            self.offsets.pop(group_id, None)
            return
        group = self.offsets.get(group_id, {})
        for k in keys:
            group.pop(k, None)

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic's offsets go with it (Kafka removes them too)."""
        await self.meta.delete_topic_offsets(topic)
        for group in self.offsets.values():
            for k in [k for k in group if k[0] == topic]:
                del group[k]
