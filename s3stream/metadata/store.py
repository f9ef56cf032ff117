"""The metadata store: streams, objects and the chunk index.

Every change that makes data part of a stream happens in one transaction, guarded by each
stream's current end offset, so that an offset can never be committed twice, by this broker
or by another one sharing the database. What a stream stands for (a Kafka partition) is the
layer above's business: it keeps its own tables in the same database, on this store's thread
and transactions (`_run`, `_txn`, and the `_new_streams` / `_delete_streams` steps it can
make part of its own transactions), and adds its rows and guards to `commit_object` through
`CommitAttachment`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path

from s3stream.metadata.backend import Backend, Connection
from s3stream.metadata.base import marks
from s3stream.metadata.maintenance import LogMaintenanceMixin
from s3stream.metadata.model import (
    ChunkRow,
    CommitAttachment,
    ObjectCommit,
    OffsetConflictError,
    StreamRow,
)
from s3stream.metadata.sqlite import SqliteBackend


class MetadataStore(LogMaintenanceMixin):
    """One store for every backend. `MetadataStore(path)` opens SQLite at path (what
    `SqliteMetadataStore(path)` always did); `open_metadata_store(url)` picks by URL."""

    def __init__(self, backend: Backend | Path) -> None:
        super().__init__(SqliteBackend(backend) if isinstance(backend, Path) else backend)

    # -- reads -----------------------------------------------------------------------------
    def _cluster_id(self) -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key='cluster_id'").fetchone()
        return str(row[0])

    async def cluster_id(self) -> str:
        return await self._run(self._cluster_id)

    def _read_log(self, db: Connection) -> tuple[list[StreamRow], list[ChunkRow]]:
        """The live streams and their chunks (inside a read transaction: one snapshot)."""
        streams = [StreamRow(*r) for r in db.execute(
            "SELECT stream_id, start_offset, end_offset FROM streams WHERE deleted = 0"
            " ORDER BY stream_id")]
        chunks = [ChunkRow(*r) for r in db.execute(
            "SELECT c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position,"
            " c.length, c.max_timestamp FROM chunks c JOIN streams s USING (stream_id)"
            " WHERE s.deleted = 0 AND c.last_offset >= s.start_offset"
            " ORDER BY c.stream_id, c.base_offset")]
        return streams, chunks

    def _read_streams(
        self, db: Connection, stream_ids: Sequence[int]
    ) -> tuple[list[StreamRow], list[ChunkRow], dict[int, str]]:
        """Some live streams, their chunks (from the start offset, in offset order) and their
        chunks' object keys (inside a read transaction: one snapshot)."""
        ids = sorted(set(stream_ids))
        inside = f"IN ({marks(len(ids))})"
        streams = [StreamRow(*r) for r in db.execute(
            "SELECT stream_id, start_offset, end_offset FROM streams WHERE deleted = 0"
            f" AND stream_id {inside} ORDER BY stream_id", ids)]
        chunks = [ChunkRow(*r) for r in db.execute(
            "SELECT c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position,"
            " c.length, c.max_timestamp FROM chunks c JOIN streams s USING (stream_id)"
            f" WHERE s.deleted = 0 AND c.last_offset >= s.start_offset AND c.stream_id {inside}"
            " ORDER BY c.stream_id, c.base_offset", ids)]
        keys = dict(db.execute(
            "SELECT object_id, key FROM objects WHERE object_id IN (SELECT object_id FROM"
            f" chunks WHERE stream_id {inside})", ids).fetchall())
        return streams, chunks, keys

    def _load(self) -> tuple[list[StreamRow], list[ChunkRow]]:
        with self._txn(read_only=True) as db:  # one snapshot: chunks match their streams
            return self._read_log(db)

    async def load(self) -> tuple[list[StreamRow], list[ChunkRow]]:
        return await self._run(self._load)

    def _object_keys(self) -> dict[int, str]:
        return dict(self.db.execute("SELECT object_id, key FROM objects").fetchall())

    async def object_keys(self) -> dict[int, str]:
        return await self._run(self._object_keys)

    # -- streams ---------------------------------------------------------------------------
    def _new_streams(self, db: Connection, count: int) -> list[StreamRow]:
        """`count` new empty streams (inside the caller's write transaction)."""
        return [StreamRow(int(db.execute("INSERT INTO streams DEFAULT VALUES RETURNING"
                                         " stream_id").fetchall()[0][0]), 0, 0)
                for _ in range(count)]

    def _create_streams(self, count: int) -> list[StreamRow]:
        with self._txn() as db:
            return self._new_streams(db, count)

    async def create_streams(self, count: int) -> list[StreamRow]:
        return await self._run(self._create_streams, count)

    def _delete_streams(self, db: Connection, stream_ids: list[int]) -> None:
        """Delete streams and their chunks (inside the caller's write transaction); their
        objects go to the garbage collector once no chunk references them."""
        self._lock_streams(db, stream_ids)  # no commit_object slips in between the deletes
        live = f"stream_id IN ({marks(len(stream_ids))})"
        db.execute(f"DELETE FROM chunks WHERE {live}", stream_ids)
        db.execute(f"UPDATE streams SET deleted=1 WHERE deleted=0 AND {live}", stream_ids)

    def _delete_streams_txn(self, stream_ids: list[int]) -> None:
        with self._txn() as db:
            self._delete_streams(db, stream_ids)

    async def delete_streams(self, stream_ids: list[int]) -> None:
        await self._run(self._delete_streams_txn, stream_ids)

    # -- the log ---------------------------------------------------------------------------
    def _counter(self, key: str, count: int) -> int:
        """Advance a counter in `meta` by count; returns its value before."""
        with self._txn() as db:
            (value,) = db.execute(f"SELECT value FROM meta WHERE key=?{self.for_update}",
                                  (key,)).fetchone()
            db.execute("UPDATE meta SET value=? WHERE key=?", (str(int(value) + count), key))
        return int(value)

    async def reserve_object_ids(self, count: int) -> int:
        """The first of `count` object ids nobody else will ever use."""
        return await self._run_now(self._counter, "next_object_id", count)

    def _commit_objects(self, objects: Sequence[ObjectCommit]) -> list[set[int]]:
        undo = functools.partial(self._undo_commits, objects)
        with self._txn(undo) as db:
            # every stream of every object locked at once, in id order (no deadlock), and
            # their end offsets carried from one object to the next
            ends = self._lock_streams(db, [c.stream_id for o in objects for c in o.chunks])
            return [self._write_object(db, ends, o) for o in objects]

    def _write_object(self, db: Connection, ends: dict[int, int], o: ObjectCommit) -> set[int]:
        """One object's rows (inside `_commit_objects`' transaction); `ends` are the locked
        streams' end offsets, moved past the object's chunks."""
        live = [c for c in o.chunks if c.stream_id in ends]
        for c in live:
            if ends[c.stream_id] != c.base_offset:
                raise OffsetConflictError(
                    f"stream {c.stream_id}: end offset {ends[c.stream_id]},"
                    f" commit starts at {c.base_offset}"
                )
            ends[c.stream_id] = c.last_offset + 1
        db.execute(
            "INSERT INTO objects(object_id, key, size, kind, created_ms) VALUES (?,?,?,?,?)",
            (o.object_id, o.key, o.size, "wal", int(time.time() * 1000)),
        )
        db.executemany(
            "INSERT INTO chunks VALUES (?,?,?,?,?,?,?)",
            [(c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position, c.length,
              c.max_timestamp) for c in live],
        )
        sids = {c.stream_id for c in live}
        db.executemany(
            "UPDATE streams SET end_offset=? WHERE stream_id=?",
            [(ends[sid], sid) for sid in sorted(sids)],
        )
        for a in o.attachments:
            a.apply(db, sids)
        return sids

    def _undo_commits(self, objects: Sequence[ObjectCommit]) -> None:
        """Take back a commit_objects whose COMMIT was in doubt, on every stream where it is
        still the last commit (the caller was told it failed and rewound to the old end):
        the last object first, so each chunk is its stream's last when it is taken back."""
        with self._txn() as db:
            self._lock_streams(db, [c.stream_id for o in objects for c in o.chunks])
            for o in reversed(objects):
                undone = []
                for c in reversed(o.chunks):  # a stream may have two in one object
                    if not db.execute("UPDATE streams SET end_offset=? WHERE stream_id=?"
                                      " AND end_offset=? AND deleted=0",
                                      (c.base_offset, c.stream_id, c.last_offset + 1)).rowcount:
                        continue
                    db.execute("DELETE FROM chunks WHERE stream_id=? AND base_offset=?"
                               " AND object_id=?", (c.stream_id, c.base_offset, c.object_id))
                    undone.append(c)
                for a in o.attachments:
                    a.undo(db, undone)

    async def commit_object(
        self, object_id: int, key: str, size: int, chunks: list[ChunkRow],
        attachments: Sequence[CommitAttachment] = (),
    ) -> set[int]:
        """Make the chunks of a durable object part of their streams, in one transaction.

        Raises OffsetConflictError (and commits nothing) unless every chunk starts at its
        stream's current end offset; the streams are locked while that is checked, so of two
        brokers committing at the same offset exactly one succeeds. Returns the ids of the
        streams that still exist. `attachments` run inside the same transaction (see
        CommitAttachment): a guard that raises refuses the commit. Any error means "not
        committed": if the connection was lost during COMMIT (CommitInDoubtError) and it
        committed after all, the store undoes it, attachments included, before its next call
        (see s3stream.metadata.base)."""
        (live,) = await self.commit_objects([ObjectCommit(object_id, key, size, chunks,
                                                          attachments)])
        return live

    async def commit_objects(self, objects: Sequence[ObjectCommit]) -> list[set[int]]:
        """`commit_object` of several objects, in order, in one transaction (the WAL's group
        commit): all of them or none. A stream's chunks may follow one another across the
        objects; each object's attachments see its own live streams. Returns each object's
        live streams."""
        return await self._run_now(self._commit_objects, list(objects))
