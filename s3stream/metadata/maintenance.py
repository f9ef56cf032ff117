"""Compaction, retention and garbage collection of objects (the SQL half)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from s3stream.metadata.base import StoreBase, marks
from s3stream.metadata.model import ChunkRow, CommitAttachment, MetadataError, ObjectRow

_INSERT_CHUNK = "INSERT INTO chunks VALUES (?,?,?,?,?,?,?)"
_DELETE_CHUNK = "DELETE FROM chunks WHERE stream_id=? AND base_offset=? AND object_id=?"


def _chunk_values(c: ChunkRow) -> tuple[int, ...]:
    return (c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position, c.length,
            c.max_timestamp)


class LogMaintenanceMixin(StoreBase):
    def _objects(self, kind: str) -> list[ObjectRow]:
        return [ObjectRow(*r) for r in self.db.execute(
            "SELECT object_id, key, size, kind, created_ms FROM objects WHERE kind=?"
            " ORDER BY object_id", (kind,))]

    async def objects(self, kind: str) -> list[ObjectRow]:
        return await self._run(self._objects, kind)

    def _chunks_of_objects(self, object_ids: list[int]) -> list[ChunkRow]:
        return [ChunkRow(*r) for r in self.db.execute(
            "SELECT stream_id, base_offset, last_offset, object_id, position, length,"
            f" max_timestamp FROM chunks WHERE object_id IN ({marks(len(object_ids))})"
            " ORDER BY stream_id, base_offset", object_ids)]

    async def chunks_of_objects(self, object_ids: list[int]) -> list[ChunkRow]:
        return await self._run(self._chunks_of_objects, object_ids)

    def _replace_chunks(self, new_objects: list[ObjectRow], new_chunks: list[ChunkRow],
                        old_chunks: list[ChunkRow], guards: Sequence[CommitAttachment]) -> int:
        undo = functools.partial(self._undo_replace, new_chunks, old_chunks)
        with self._txn(undo) as db:
            live = self._lock_streams(db, [c.stream_id for c in old_chunks + new_chunks])
            for g in guards:  # e.g. the writer still leads these streams
                g.apply(db, set(live))
            removed = db.executemany(_DELETE_CHUNK, [(c.stream_id, c.base_offset, c.object_id)
                                                     for c in old_chunks])
            if removed != len(old_chunks):
                raise MetadataError("the chunks to replace changed underneath the compaction")
            db.executemany("INSERT INTO objects VALUES (?,?,?,?,?)",
                           [(o.object_id, o.key, o.size, o.kind, o.created_ms)
                            for o in new_objects])
            db.executemany(_INSERT_CHUNK, [_chunk_values(c) for c in new_chunks])
        return removed

    def _undo_replace(self, new_chunks: list[ChunkRow], old_chunks: list[ChunkRow]) -> None:
        """Put the old chunks back (a replace_chunks whose COMMIT was in doubt); the new
        objects stay behind, unreferenced, for the garbage collector."""
        with self._txn() as db:
            self._lock_streams(db, [c.stream_id for c in old_chunks + new_chunks])
            gone = sum(db.execute(_DELETE_CHUNK, (c.stream_id, c.base_offset,
                                                  c.object_id)).rowcount for c in new_chunks)
            old_ids = sorted({c.object_id for c in old_chunks})
            (known,) = db.execute(f"SELECT count(*) FROM objects WHERE object_id IN"
                                  f" ({marks(len(old_ids))})", old_ids).fetchone()
            if gone != len(new_chunks) or known != len(old_ids):
                raise MetadataError("the compacted chunks changed since; not undoing")
            db.executemany(_INSERT_CHUNK, [_chunk_values(c) for c in old_chunks])

    async def replace_chunks(self, new_objects: list[ObjectRow], new_chunks: list[ChunkRow],
                             old_chunks: list[ChunkRow],
                             guards: Sequence[CommitAttachment] = ()) -> None:
        """Swap chunks for their copies in new objects, in one transaction (compaction).
        If it fails with CommitInDoubtError the old chunks are what the index keeps.
        `guards` are checked in the transaction (their `apply` with the live streams
        touched); one that raises refuses the swap."""
        await self._run(self._replace_chunks, new_objects, new_chunks, old_chunks, guards)

    def _truncate(self, stream_id: int, start_offset: int,
                  guards: Sequence[CommitAttachment]) -> int:
        with self._txn() as db:
            (current,) = db.execute("SELECT start_offset FROM streams WHERE stream_id=?"
                                    f"{self.for_update}", (stream_id,)).fetchone()
            for g in guards:
                g.apply(db, {stream_id})
            start = max(current, start_offset)
            db.execute("UPDATE streams SET start_offset=? WHERE stream_id=?", (start, stream_id))
            db.execute("DELETE FROM chunks WHERE stream_id=? AND last_offset < ?",
                       (stream_id, start))
        return int(start)

    async def truncate(self, stream_id: int, start_offset: int,
                       guards: Sequence[CommitAttachment] = ()) -> int:
        """Move a stream's log start offset forward (never back); drop chunks wholly below
        it. Returns the new start offset. `guards` as for replace_chunks."""
        return await self._run(self._truncate, stream_id, start_offset, guards)

    def _unreferenced(self, older_than_ms: int) -> list[ObjectRow]:
        return [ObjectRow(*r) for r in self.db.execute(
            "SELECT object_id, key, size, kind, created_ms FROM objects o WHERE created_ms < ?"
            " AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.object_id = o.object_id)",
            (older_than_ms,))]

    async def unreferenced_objects(self, older_than_ms: int) -> list[ObjectRow]:
        return await self._run(self._unreferenced, older_than_ms)

    def _forget_objects(self, object_ids: list[int]) -> None:
        with self._txn() as db:
            for oid in object_ids:
                db.execute("DELETE FROM objects WHERE object_id=? AND NOT EXISTS"
                           " (SELECT 1 FROM chunks c WHERE c.object_id = ?)", (oid, oid))

    async def forget_objects(self, object_ids: list[int]) -> None:
        await self._run(self._forget_objects, object_ids)
