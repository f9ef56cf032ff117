"""The metadata store: topics, streams (one per partition), objects and the chunk index.

Every change that makes data part of the log happens in one transaction, guarded by each
stream's current end offset, so that an offset can never be committed twice, by this broker
or by another one sharing the database.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from pathlib import Path

from s3stream.metadata.backend import Backend
from s3stream.metadata.base import marks
from s3stream.metadata.maintenance import LogMaintenanceMixin
from s3stream.metadata.model import (
    PRODUCER_BATCHES_KEPT,
    ChunkRow,
    MetadataError,
    OffsetConflictError,
    ProducerBatchRow,
    StreamRow,
    TopicRow,
)
from s3stream.metadata.offsets import GroupOffsetsMixin
from s3stream.metadata.sqlite import SqliteBackend


class MetadataStore(GroupOffsetsMixin, LogMaintenanceMixin):
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

    def _load(self) -> tuple[list[TopicRow], list[StreamRow], list[ChunkRow]]:
        with self._txn(read_only=True) as db:  # one snapshot: chunks match their streams
            topics = [
                TopicRow(name, uuid.UUID(tid), json.loads(cfg))
                for name, tid, cfg in db.execute("SELECT name, topic_id, configs FROM topics")
            ]
            streams = [StreamRow(*r) for r in db.execute(
                "SELECT stream_id, topic, partition, start_offset, end_offset FROM streams"
                " WHERE deleted = 0")]
            chunks = [ChunkRow(*r) for r in db.execute(
                "SELECT c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position,"
                " c.length, c.max_timestamp FROM chunks c JOIN streams s USING (stream_id)"
                " WHERE s.deleted = 0 AND c.last_offset >= s.start_offset"
                " ORDER BY c.stream_id, c.base_offset")]
        return topics, streams, chunks

    async def load(self) -> tuple[list[TopicRow], list[StreamRow], list[ChunkRow]]:
        return await self._run(self._load)

    def _object_keys(self) -> dict[int, str]:
        return dict(self.db.execute("SELECT object_id, key FROM objects").fetchall())

    async def object_keys(self) -> dict[int, str]:
        return await self._run(self._object_keys)

    # -- topics ----------------------------------------------------------------------------
    def _create_topic(
        self, name: str, partitions: int, configs: dict[str, str]
    ) -> tuple[TopicRow, list[StreamRow]]:
        with self._txn() as db:
            if db.execute("SELECT 1 FROM topics WHERE name=?", (name,)).fetchone():
                raise MetadataError(f"topic {name!r} already exists")
            tid = uuid.uuid4()
            db.execute(  # a concurrent creator of the same name fails here (primary key)
                "INSERT INTO topics(name, topic_id, configs, created_ms) VALUES (?,?,?,?)",
                (name, str(tid), json.dumps(configs), int(time.time() * 1000)),
            )
            streams = [self._add_stream(name, p) for p in range(partitions)]
        return TopicRow(name, tid, configs), streams

    def _add_stream(self, topic: str, partition: int) -> StreamRow:
        (sid,) = self.db.execute(
            "INSERT INTO streams(topic, partition) VALUES (?, ?) RETURNING stream_id",
            (topic, partition),
        ).fetchall()[0]
        return StreamRow(int(sid), topic, partition, 0, 0)

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str]
    ) -> tuple[TopicRow, list[StreamRow]]:
        return await self._run(self._create_topic, name, partitions, configs)

    def _lock_topic(self, name: str) -> None:
        """Serialise changes to a topic's partitions (adding them, deleting the topic)."""
        self.db.execute(f"SELECT 1 FROM topics WHERE name=?{self.for_update}", (name,))

    def _add_partitions(self, topic: str, first: int, count: int) -> list[StreamRow]:
        with self._txn():
            self._lock_topic(topic)
            streams = [self._add_stream(topic, p) for p in range(first, first + count)]
        return streams

    async def add_partitions(self, topic: str, first: int, count: int) -> list[StreamRow]:
        return await self._run(self._add_partitions, topic, first, count)

    def _delete_topic(self, name: str) -> None:
        with self._txn() as db:
            self._lock_topic(name)
            ids = [sid for (sid,) in db.execute(
                "SELECT stream_id FROM streams WHERE topic=? AND deleted=0", (name,))]
            self._lock_streams(db, ids)  # no commit_object slips in between the deletes
            live = f"stream_id IN ({marks(len(ids))})"
            db.execute(f"DELETE FROM chunks WHERE {live}", ids)
            db.execute(f"DELETE FROM producer_batches WHERE {live}", ids)
            db.execute("DELETE FROM topics WHERE name=?", (name,))
            db.execute("UPDATE streams SET deleted=1 WHERE topic=? AND deleted=0", (name,))

    async def delete_topic(self, name: str) -> None:
        await self._run(self._delete_topic, name)

    def _set_configs(self, name: str, configs: dict[str, str]) -> None:
        self.db.execute("UPDATE topics SET configs=? WHERE name=?", (json.dumps(configs), name))

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        await self._run(self._set_configs, name, configs)

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
        return await self._run(self._counter, "next_object_id", count)

    def _next_producer_id(self) -> int:
        self.db.execute("INSERT INTO meta(key, value) VALUES ('next_producer_id', '1000')"
                        " ON CONFLICT DO NOTHING")
        return self._counter("next_producer_id", 1)

    async def next_producer_id(self) -> int:
        """A producer id never handed out before (durable before it is returned)."""
        return await self._run(self._next_producer_id)

    def _commit_object(
        self, object_id: int, key: str, size: int, chunks: list[ChunkRow],
        producers: list[ProducerBatchRow],
    ) -> set[int]:
        undo = functools.partial(self._undo_commit, chunks)
        with self._txn(undo) as db:
            ends = self._lock_streams(db, [c.stream_id for c in chunks])
            live = [c for c in chunks if c.stream_id in ends]
            for c in live:
                if ends[c.stream_id] != c.base_offset:
                    raise OffsetConflictError(
                        f"stream {c.stream_id}: end offset {ends[c.stream_id]},"
                        f" commit starts at {c.base_offset}"
                    )
                ends[c.stream_id] = c.last_offset + 1
            db.execute(
                "INSERT INTO objects(object_id, key, size, kind, created_ms) VALUES (?,?,?,?,?)",
                (object_id, key, size, "wal", int(time.time() * 1000)),
            )
            db.executemany(
                "INSERT INTO chunks VALUES (?,?,?,?,?,?,?)",
                [(c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position, c.length,
                  c.max_timestamp) for c in live],
            )
            db.executemany(
                "UPDATE streams SET end_offset=? WHERE stream_id=?",
                [(end, sid) for sid, end in ends.items()],
            )
            self._record_producers([p for p in producers if p.stream_id in ends])
        return {c.stream_id for c in live}

    def _undo_commit(self, chunks: list[ChunkRow]) -> None:
        """Take back a commit_object whose COMMIT was in doubt, on every stream where it is
        still the last commit (the caller was told it failed and rewound to the old end)."""
        with self._txn() as db:
            self._lock_streams(db, [c.stream_id for c in chunks])
            for c in chunks:
                if not db.execute("UPDATE streams SET end_offset=? WHERE stream_id=?"
                                  " AND end_offset=? AND deleted=0",
                                  (c.base_offset, c.stream_id, c.last_offset + 1)).rowcount:
                    continue
                db.execute("DELETE FROM chunks WHERE stream_id=? AND base_offset=?"
                           " AND object_id=?", (c.stream_id, c.base_offset, c.object_id))
                db.execute("DELETE FROM producer_batches WHERE stream_id=? AND base_offset"
                           " BETWEEN ? AND ?", (c.stream_id, c.base_offset, c.last_offset))

    def _record_producers(self, rows: list[ProducerBatchRow]) -> None:
        if not rows:
            return
        db = self.db
        db.executemany(
            "INSERT INTO producer_batches VALUES (?,?,?,?,?,?,?)"
            " ON CONFLICT (stream_id, producer_id, base_offset) DO UPDATE SET"
            " epoch=excluded.epoch, first_seq=excluded.first_seq,"
            " last_seq=excluded.last_seq, last_offset=excluded.last_offset",
            [(r.stream_id, r.producer_id, r.epoch, r.first_seq, r.last_seq, r.base_offset,
              r.last_offset) for r in rows])
        db.executemany(
            "DELETE FROM producer_batches WHERE stream_id=? AND producer_id=? AND base_offset <"
            " (SELECT min(base_offset) FROM (SELECT base_offset FROM producer_batches"
            "  WHERE stream_id=? AND producer_id=? ORDER BY base_offset DESC LIMIT ?) AS kept)",
            [(sid, pid, sid, pid, PRODUCER_BATCHES_KEPT)
             for sid, pid in {(r.stream_id, r.producer_id) for r in rows}])

    def _load_producers(self) -> list[ProducerBatchRow]:
        return [ProducerBatchRow(*r) for r in self.db.execute(
            "SELECT p.stream_id, p.producer_id, p.epoch, p.first_seq, p.last_seq, p.base_offset,"
            " p.last_offset FROM producer_batches p JOIN streams s USING (stream_id)"
            " WHERE s.deleted = 0 ORDER BY p.stream_id, p.producer_id, p.base_offset")]

    async def load_producers(self) -> list[ProducerBatchRow]:
        return await self._run(self._load_producers)

    async def commit_object(
        self, object_id: int, key: str, size: int, chunks: list[ChunkRow],
        producers: list[ProducerBatchRow] | None = None,
    ) -> set[int]:
        """Make the chunks of a durable object part of their streams, in one transaction.

        Raises OffsetConflictError (and commits nothing) unless every chunk starts at its
        stream's current end offset; the streams are locked while that is checked, so of two
        brokers committing at the same offset exactly one succeeds. Returns the ids of the
        streams that still exist. Any error means "not committed": if the connection was
        lost during COMMIT (CommitInDoubtError) and it committed after all, the store undoes
        it before its next call (see s3stream.metadata.base)."""
        return await self._run(self._commit_object, object_id, key, size, chunks,
                               producers or [])
