"""The metadata store: topics, streams (one per partition), objects and the chunk index.

Every change that makes data part of the log happens in one transaction, guarded by each
stream's current end offset, so that an offset can never be committed twice.
Backend here: SQLite (`sqlite:///path/meta.db`), driven from one dedicated thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS topics(
    name TEXT PRIMARY KEY, topic_id TEXT NOT NULL, configs TEXT NOT NULL,
    created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS streams(
    stream_id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,
    partition INTEGER NOT NULL, start_offset INTEGER NOT NULL DEFAULT 0,
    end_offset INTEGER NOT NULL DEFAULT 0, epoch INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS streams_live ON streams(topic, partition) WHERE deleted = 0;
CREATE TABLE IF NOT EXISTS objects(
    object_id INTEGER PRIMARY KEY, key TEXT NOT NULL, size INTEGER NOT NULL,
    kind TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS chunks(
    stream_id INTEGER NOT NULL, base_offset INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    object_id INTEGER NOT NULL, position INTEGER NOT NULL, length INTEGER NOT NULL,
    max_timestamp INTEGER NOT NULL, PRIMARY KEY(stream_id, base_offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producer_batches(
    stream_id INTEGER NOT NULL, producer_id INTEGER NOT NULL, epoch INTEGER NOT NULL,
    first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, base_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL, PRIMARY KEY(stream_id, producer_id, base_offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets(
    group_id TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL, leader_epoch INTEGER NOT NULL, metadata TEXT,
    commit_ms INTEGER NOT NULL, PRIMARY KEY(group_id, topic, partition)) WITHOUT ROWID;
"""


class MetadataError(Exception):
    pass


class OffsetConflictError(MetadataError):
    """A commit's base offset is not the stream's end offset: someone else wrote, or a retry."""


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class StreamRow:
    stream_id: int
    topic: str
    partition: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class ChunkRow:
    stream_id: int
    base_offset: int
    last_offset: int
    object_id: int
    position: int
    length: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class ProducerBatchRow:
    """One idempotent batch of a stream: what sequence checks after a restart need."""

    stream_id: int
    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


PRODUCER_BATCHES_KEPT = 5  # per stream and producer, like Kafka


@dataclass(frozen=True, slots=True)
class OffsetRow:
    group_id: str
    topic: str
    partition: int
    committed_offset: int
    leader_epoch: int
    metadata: str | None
    commit_ms: int


class GroupOffsetsMixin:
    """Committed consumer-group offsets (the SQL half of the group coordinator)."""

    @property
    def db(self) -> sqlite3.Connection:
        raise NotImplementedError

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:  # provided by the store
        raise NotImplementedError

    def _txn(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _load_offsets(self) -> list[OffsetRow]:
        return [OffsetRow(*r) for r in self.db.execute(
            "SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata,"
            " commit_ms FROM group_offsets")]

    async def load_offsets(self) -> list[OffsetRow]:
        return await self._run(self._load_offsets)

    def _commit_offsets(self, rows: list[OffsetRow]) -> None:
        db = self.db
        with self._txn():
            db.executemany(
                "INSERT INTO group_offsets VALUES (?,?,?,?,?,?,?) ON CONFLICT"
                " (group_id, topic, partition) DO UPDATE SET"
                " committed_offset=excluded.committed_offset,"
                " leader_epoch=excluded.leader_epoch, metadata=excluded.metadata,"
                " commit_ms=excluded.commit_ms",
                [(r.group_id, r.topic, r.partition, r.committed_offset, r.leader_epoch,
                  r.metadata, r.commit_ms) for r in rows])

    async def commit_offsets(self, rows: list[OffsetRow]) -> None:
        """Store committed offsets durably, all or none."""
        await self._run(self._commit_offsets, rows)

    def _delete_offsets(self, group_id: str, keys: list[tuple[str, int]] | None) -> None:
        if keys is None:
            self.db.execute("DELETE FROM group_offsets WHERE group_id=?", (group_id,))
        else:
            self.db.executemany(
                "DELETE FROM group_offsets WHERE group_id=? AND topic=? AND partition=?",
                [(group_id, t, p) for t, p in keys])

    def _delete_topic_offsets(self, topic: str) -> None:
        self.db.execute("DELETE FROM group_offsets WHERE topic=?", (topic,))

    async def delete_topic_offsets(self, topic: str) -> None:
        await self._run(self._delete_topic_offsets, topic)

    async def delete_offsets(self, group_id: str, keys: list[tuple[str, int]] | None) -> None:
        """Delete some (or, with None, all) of a group's committed offsets."""
        await self._run(self._delete_offsets, group_id, keys)


@dataclass(frozen=True, slots=True)
class ObjectRow:
    object_id: int
    key: str
    size: int
    kind: str
    created_ms: int


class LogMaintenanceMixin:
    """Compaction, retention and garbage collection of objects (the SQL half)."""

    @property
    def db(self) -> sqlite3.Connection:
        raise NotImplementedError

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:  # provided by the store
        raise NotImplementedError

    def _txn(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _objects(self, kind: str) -> list[ObjectRow]:
        return [ObjectRow(*r) for r in self.db.execute(
            "SELECT object_id, key, size, kind, created_ms FROM objects WHERE kind=?"
            " ORDER BY object_id", (kind,))]

    async def objects(self, kind: str) -> list[ObjectRow]:
        return await self._run(self._objects, kind)

    def _chunks_of_objects(self, object_ids: list[int]) -> list[ChunkRow]:
        marks = ",".join("?" * len(object_ids))
        return [ChunkRow(*r) for r in self.db.execute(
            "SELECT stream_id, base_offset, last_offset, object_id, position, length,"
            f" max_timestamp FROM chunks WHERE object_id IN ({marks})"
            " ORDER BY stream_id, base_offset", object_ids)]

    async def chunks_of_objects(self, object_ids: list[int]) -> list[ChunkRow]:
        return await self._run(self._chunks_of_objects, object_ids)

    def _replace_chunks(self, new_objects: list[ObjectRow], new_chunks: list[ChunkRow],
                        old_chunks: list[ChunkRow]) -> int:
        with self._txn() as db:
            removed = 0
            for c in old_chunks:
                removed += db.execute(
                    "DELETE FROM chunks WHERE stream_id=? AND base_offset=? AND object_id=?",
                    (c.stream_id, c.base_offset, c.object_id)).rowcount
            if removed != len(old_chunks):
                raise MetadataError("the chunks to replace changed underneath the compaction")
            db.executemany("INSERT INTO objects VALUES (?,?,?,?,?)",
                           [(o.object_id, o.key, o.size, o.kind, o.created_ms)
                            for o in new_objects])
            db.executemany("INSERT INTO chunks VALUES (?,?,?,?,?,?,?)",
                           [(c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position,
                             c.length, c.max_timestamp) for c in new_chunks])
        return removed

    async def replace_chunks(self, new_objects: list[ObjectRow], new_chunks: list[ChunkRow],
                             old_chunks: list[ChunkRow]) -> None:
        """Swap chunks for their copies in new objects, in one transaction (compaction)."""
        await self._run(self._replace_chunks, new_objects, new_chunks, old_chunks)

    def _truncate(self, stream_id: int, start_offset: int) -> int:
        with self._txn() as db:
            (current,) = db.execute("SELECT start_offset FROM streams WHERE stream_id=?",
                                    (stream_id,)).fetchone()
            start = max(current, start_offset)
            db.execute("UPDATE streams SET start_offset=? WHERE stream_id=?", (start, stream_id))
            db.execute("DELETE FROM chunks WHERE stream_id=? AND last_offset < ?",
                       (stream_id, start))
        return int(start)

    async def truncate(self, stream_id: int, start_offset: int) -> int:
        """Move a stream's log start offset forward (never back); drop chunks wholly below
        it. Returns the new start offset."""
        return await self._run(self._truncate, stream_id, start_offset)

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


class SqliteMetadataStore(GroupOffsetsMixin, LogMaintenanceMixin):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-meta")
        self._db: sqlite3.Connection | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @contextlib.contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: it takes the write lock up front)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "metadata store not open"
        return self._db

    # -- lifecycle -------------------------------------------------------------------------
    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=10000")
        db.executescript(SCHEMA)
        db.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('cluster_id', ?)",
            (uuid.uuid4().hex[:22],),
        )
        db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('next_object_id', '1')")
        self._db = db

    async def open(self) -> None:
        await self._run(self._open)

    async def close(self) -> None:
        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await self._run(close)
        self._pool.shutdown(wait=True)

    # -- reads -----------------------------------------------------------------------------
    def _cluster_id(self) -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key='cluster_id'").fetchone()
        return str(row[0])

    async def cluster_id(self) -> str:
        return await self._run(self._cluster_id)

    def _load(self) -> tuple[list[TopicRow], list[StreamRow], list[ChunkRow]]:
        topics = [
            TopicRow(name, uuid.UUID(tid), json.loads(cfg))
            for name, tid, cfg in self.db.execute("SELECT name, topic_id, configs FROM topics")
        ]
        streams = [
            StreamRow(*r)
            for r in self.db.execute(
                "SELECT stream_id, topic, partition, start_offset, end_offset FROM streams"
                " WHERE deleted = 0"
            )
        ]
        chunks = [
            ChunkRow(*r)
            for r in self.db.execute(
                "SELECT c.stream_id, c.base_offset, c.last_offset, c.object_id, c.position,"
                " c.length, c.max_timestamp FROM chunks c JOIN streams s USING (stream_id)"
                " WHERE s.deleted = 0 AND c.last_offset >= s.start_offset"
                " ORDER BY c.stream_id, c.base_offset"
            )
        ]
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
        db = self.db
        with self._txn():
            if db.execute("SELECT 1 FROM topics WHERE name=?", (name,)).fetchone():
                raise MetadataError(f"topic {name!r} already exists")
            tid = uuid.uuid4()
            db.execute(
                "INSERT INTO topics(name, topic_id, configs, created_ms) VALUES (?,?,?,?)",
                (name, str(tid), json.dumps(configs), int(time.time() * 1000)),
            )
            streams = [self._add_stream(name, p) for p in range(partitions)]
        return TopicRow(name, tid, configs), streams

    def _add_stream(self, topic: str, partition: int) -> StreamRow:
        cur = self.db.execute(
            "INSERT INTO streams(topic, partition) VALUES (?, ?)", (topic, partition)
        )
        assert cur.lastrowid is not None
        return StreamRow(cur.lastrowid, topic, partition, 0, 0)

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str]
    ) -> tuple[TopicRow, list[StreamRow]]:
        return await self._run(self._create_topic, name, partitions, configs)

    def _add_partitions(self, topic: str, first: int, count: int) -> list[StreamRow]:
        with self._txn():
            streams = [self._add_stream(topic, p) for p in range(first, first + count)]
        return streams

    async def add_partitions(self, topic: str, first: int, count: int) -> list[StreamRow]:
        return await self._run(self._add_partitions, topic, first, count)

    def _delete_topic(self, name: str) -> None:
        db = self.db
        with self._txn():
            live = "SELECT stream_id FROM streams WHERE topic=? AND deleted=0"
            db.execute(f"DELETE FROM chunks WHERE stream_id IN ({live})", (name,))
            db.execute(f"DELETE FROM producer_batches WHERE stream_id IN ({live})", (name,))
            db.execute("DELETE FROM topics WHERE name=?", (name,))
            db.execute("UPDATE streams SET deleted=1 WHERE topic=? AND deleted=0", (name,))

    async def delete_topic(self, name: str) -> None:
        await self._run(self._delete_topic, name)

    def _set_configs(self, name: str, configs: dict[str, str]) -> None:
        self.db.execute("UPDATE topics SET configs=? WHERE name=?", (json.dumps(configs), name))

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        await self._run(self._set_configs, name, configs)

    # -- the log ---------------------------------------------------------------------------
    def _reserve_object_ids(self, count: int) -> int:
        db = self.db
        with self._txn():
            (first,) = db.execute("SELECT value FROM meta WHERE key='next_object_id'").fetchone()
            first = int(first)
            db.execute("UPDATE meta SET value=? WHERE key='next_object_id'", (str(first + count),))
        return first

    async def reserve_object_ids(self, count: int) -> int:
        """The first of `count` object ids nobody else will ever use."""
        return await self._run(self._reserve_object_ids, count)

    def _commit_object(
        self, object_id: int, key: str, size: int, chunks: list[ChunkRow],
        producers: list[ProducerBatchRow],
    ) -> set[int]:
        db = self.db
        with self._txn():
            ends = dict(
                db.execute(
                    "SELECT stream_id, end_offset FROM streams WHERE deleted=0 AND stream_id IN"
                    f" ({','.join('?' * len(chunks))})",
                    [c.stream_id for c in chunks],
                ).fetchall()
            )
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
                [
                    (
                        c.stream_id,
                        c.base_offset,
                        c.last_offset,
                        c.object_id,
                        c.position,
                        c.length,
                        c.max_timestamp,
                    )
                    for c in live
                ],
            )
            db.executemany(
                "UPDATE streams SET end_offset=? WHERE stream_id=?",
                [(end, sid) for sid, end in ends.items()],
            )
            self._record_producers([p for p in producers if p.stream_id in ends])
        return {c.stream_id for c in live}

    def _record_producers(self, rows: list[ProducerBatchRow]) -> None:
        if not rows:
            return
        db = self.db
        db.executemany(
            "INSERT OR REPLACE INTO producer_batches VALUES (?,?,?,?,?,?,?)",
            [(r.stream_id, r.producer_id, r.epoch, r.first_seq, r.last_seq, r.base_offset,
              r.last_offset) for r in rows])
        db.executemany(
            "DELETE FROM producer_batches WHERE stream_id=? AND producer_id=? AND base_offset <"
            " (SELECT min(base_offset) FROM (SELECT base_offset FROM producer_batches"
            "  WHERE stream_id=? AND producer_id=? ORDER BY base_offset DESC LIMIT ?))",
            [(sid, pid, sid, pid, PRODUCER_BATCHES_KEPT)
             for sid, pid in {(r.stream_id, r.producer_id) for r in rows}])

    def _load_producers(self) -> list[ProducerBatchRow]:
        return [ProducerBatchRow(*r) for r in self.db.execute(
            "SELECT p.stream_id, p.producer_id, p.epoch, p.first_seq, p.last_seq, p.base_offset,"
            " p.last_offset FROM producer_batches p JOIN streams s USING (stream_id)"
            " WHERE s.deleted = 0 ORDER BY p.stream_id, p.producer_id, p.base_offset")]

    async def load_producers(self) -> list[ProducerBatchRow]:
        return await self._run(self._load_producers)

    def _next_producer_id(self) -> int:
        db = self.db
        with self._txn():
            db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('next_producer_id', '1000')")
            (pid,) = db.execute("SELECT value FROM meta WHERE key='next_producer_id'").fetchone()
            db.execute("UPDATE meta SET value=? WHERE key='next_producer_id'", (str(int(pid) + 1),))
        return int(pid)

    async def next_producer_id(self) -> int:
        """A producer id never handed out before (durable before it is returned)."""
        return await self._run(self._next_producer_id)

    async def commit_object(
        self, object_id: int, key: str, size: int, chunks: list[ChunkRow],
        producers: list[ProducerBatchRow] | None = None,
    ) -> set[int]:
        """Make the chunks of a durable object part of their streams, in one transaction.

        Raises OffsetConflictError (and commits nothing) unless every chunk starts at its
        stream's current end offset. Returns the ids of the streams that still exist."""
        return await self._run(self._commit_object, object_id, key, size, chunks,
                               producers or [])


def open_metadata_store(url: str) -> SqliteMetadataStore:
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        # sqlite:///relative/or/absolute -> path after the third slash (absolute with four)
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else parsed.path
        return SqliteMetadataStore(Path(path))
    raise ValueError(f"unsupported metadata URL {url!r} (use sqlite:///PATH)")
