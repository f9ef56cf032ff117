"""Table topics across brokers: the rows through which partition workers and a table's commit
coordinator work together (tabletopic.worker, tabletopic.coordinator). Component
"broker.table_work" of the shared migration runner:

- `kafka_table_requests(topic, commit_id, node_id, leader_epoch, requested_ms)`: the latest
  commit request of a table topic's coordinator (the leader of partition 0), ids increasing;
- `kafka_table_workers(topic, partition, node_id, leader_epoch, answered, pending_records,
  pending_bytes, updated_ms)`: who writes each partition, the last request it answered, what
  it holds not yet written;
- `kafka_table_files(topic, partition, start_offset, leader_epoch, next_offset, node_id,
  commit_id, files, records, dead, written_ms)`: a worker's answer: the data files holding
  the rows of offsets [start, next) of a partition (JSON, tabletopic.datafiles; dead letters
  already in the dead-letter topic), waiting for the coordinator's commit;
- `kafka_table_progress(topic, table_name, offsets, snapshot_id, commit_ms)`: the table's
  `floe.offsets` after its last commit (read from the table by the coordinator), for the
  workers (did my files land?) and for the table's consumer group `floe-table.<table>`.

A worker stores an answer only while it leads the partition at the epoch it read it under
(checked in the same transaction, as broker.cluster.guard does for the log): the files of a
deposed leader never reach a commit. Exactly once does not rest on these rows: the
coordinator commits a partition's files only from the table's own `floe.offsets` on, under the
catalog's compare-and-swap (tabletopic.commit).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from s3stream.metadata import MetadataStore
from s3stream.metadata.backend import Connection
from s3stream.metadata.migrations import Component, sql_migration

COMPONENT = Component("broker.table_work", [sql_migration(
    """CREATE TABLE kafka_table_requests(
        topic TEXT PRIMARY KEY, commit_id {int} NOT NULL, node_id {int} NOT NULL,
        leader_epoch {int} NOT NULL, requested_ms {int} NOT NULL);
    CREATE TABLE kafka_table_workers(
        topic TEXT NOT NULL, partition {int} NOT NULL, node_id {int} NOT NULL,
        leader_epoch {int} NOT NULL, answered {int} NOT NULL, pending_records {int} NOT NULL,
        pending_bytes {int} NOT NULL, updated_ms {int} NOT NULL,
        PRIMARY KEY(topic, partition)){without_rowid};
    CREATE TABLE kafka_table_files(
        topic TEXT NOT NULL, partition {int} NOT NULL, start_offset {int} NOT NULL,
        leader_epoch {int} NOT NULL, next_offset {int} NOT NULL, node_id {int} NOT NULL,
        commit_id {int} NOT NULL, files TEXT NOT NULL, records {int} NOT NULL,
        dead {int} NOT NULL, written_ms {int} NOT NULL,
        PRIMARY KEY(topic, partition, start_offset, leader_epoch)){without_rowid};
    CREATE TABLE kafka_table_progress(
        topic TEXT PRIMARY KEY, table_name TEXT NOT NULL, offsets TEXT NOT NULL,
        snapshot_id {int}, commit_ms {int} NOT NULL)"""
)])


@dataclass(frozen=True)
class FileSet:
    """A worker's answer for one partition: files holding the rows of offsets [start, next)."""

    topic: str
    partition: int
    start: int
    leader_epoch: int
    next: int
    node_id: int
    commit_id: int
    files: str  # JSON (tabletopic.datafiles)
    records: int
    dead: int
    written_ms: int

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.partition, self.start, self.leader_epoch)


@dataclass(frozen=True)
class Answer:
    """What a worker hands in for one partition, answering a request: its files (None: none,
    it holds nothing new) and what it holds besides."""

    partition: int
    leader_epoch: int
    files: FileSet | None
    pending_records: int
    pending_bytes: int


@dataclass(frozen=True)
class WorkerRow:
    topic: str
    partition: int
    node_id: int
    leader_epoch: int
    answered: int
    pending_records: int
    pending_bytes: int
    updated_ms: int


@dataclass(frozen=True)
class Progress:
    topic: str
    table: str  # "<namespace>.<table>"
    offsets: Mapping[int, int]
    snapshot_id: int | None
    commit_ms: int


@dataclass(frozen=True)
class Outstanding:
    """What a coordinator reads before a commit, in one snapshot: the files waiting, each
    partition's current leader and epoch, the workers, the last progress published."""

    files: list[FileSet]
    leaders: dict[int, tuple[int, int]]  # partition -> (node id, leader epoch)
    workers: dict[int, WorkerRow]
    progress: Progress | None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _leads(db: Connection, topic: str, partition: int, node_id: int, epoch: int,
           for_update: str) -> bool:
    row = db.execute("SELECT leader, leader_epoch FROM kafka_partitions WHERE topic=? AND"
                     f" partition=?{for_update}", (topic, partition)).fetchone()
    return row is not None and (int(row[0]), int(row[1])) == (node_id, epoch)


def _file_set(row: tuple[object, ...]) -> FileSet:
    t, p, s, e, n, node, c, files, recs, dead, ms = row
    return FileSet(str(t), int(str(p)), int(str(s)), int(str(e)), int(str(n)), int(str(node)),
                   int(str(c)), str(files), int(str(recs)), int(str(dead)), int(str(ms)))


FILE_COLUMNS = ("topic, partition, start_offset, leader_epoch, next_offset, node_id, commit_id,"
                " files, records, dead, written_ms")
WORKER_COLUMNS = ("topic, partition, node_id, leader_epoch, answered, pending_records,"
                  " pending_bytes, updated_ms")


def _progress(db: Connection, topic: str | None) -> list[Progress]:
    where, args = ("WHERE topic=?", (topic,)) if topic is not None else ("", ())
    return [Progress(str(t), str(name), {int(p): int(o) for p, o in json.loads(offs).items()},
                     None if snap is None else int(snap), int(ms))
            for t, name, offs, snap, ms in db.execute(
                "SELECT topic, table_name, offsets, snapshot_id, commit_ms FROM"
                f" kafka_table_progress {where} ORDER BY topic", args)]


class TableWork:
    """The table-work rows of the metadata store (see the module docstring)."""

    def __init__(self, meta: MetadataStore) -> None:
        self.meta = meta

    async def open(self) -> None:
        await self.meta.migrate(COMPONENT)

    # -- the coordinator ---------------------------------------------------------------------
    async def request(self, topic: str, node_id: int, leader_epoch: int) -> int | None:
        """A new commit request of `topic`'s coordinator: its id, or None when `node_id` does
        not lead partition 0 at `leader_epoch` (another broker coordinates now)."""

        def write() -> int | None:
            with self.meta._txn() as db:
                if not _leads(db, topic, 0, node_id, leader_epoch, self.meta.for_update):
                    return None
                row = db.execute("SELECT commit_id FROM kafka_table_requests WHERE topic=?"
                                 f"{self.meta.for_update}", (topic,)).fetchone()
                commit_id = 1 if row is None else int(row[0]) + 1
                db.execute(
                    "INSERT INTO kafka_table_requests VALUES (?,?,?,?,?) ON CONFLICT (topic)"
                    " DO UPDATE SET commit_id=excluded.commit_id, node_id=excluded.node_id,"
                    " leader_epoch=excluded.leader_epoch, requested_ms=excluded.requested_ms",
                    (topic, commit_id, node_id, leader_epoch, _now_ms()))
                return commit_id

        return await self.meta._run(write)

    async def outstanding(self, topic: str) -> Outstanding:
        def read() -> Outstanding:
            with self.meta._txn(read_only=True) as db:
                files = [_file_set(r) for r in db.execute(
                    f"SELECT {FILE_COLUMNS} FROM kafka_table_files WHERE topic=?"
                    " ORDER BY partition, start_offset, leader_epoch", (topic,))]
                leaders = {int(p): (int(n), int(e)) for p, n, e in db.execute(
                    "SELECT partition, leader, leader_epoch FROM kafka_partitions"
                    " WHERE topic=?", (topic,))}
                workers = {int(r[1]): WorkerRow(str(r[0]), *(int(x) for x in r[1:]))
                           for r in db.execute(f"SELECT {WORKER_COLUMNS} FROM"
                                               " kafka_table_workers WHERE topic=?", (topic,))}
                progress = _progress(db, topic)
            return Outstanding(files, leaders, workers, progress[0] if progress else None)

        return await self.meta._run(read)

    async def settle(self, topic: str, table: str, offsets: Mapping[int, int],
                     snapshot_id: int | None, done: list[tuple[int, int, int]],
                     node_id: int, leader_epoch: int) -> bool:
        """After a commit (or on finding the table ahead): publish the table's offsets and
        remove the answers `done` (partition, start, epoch): committed ones and those that
        can never be (behind the table, of an old epoch, cut off from the table's offsets).
        Their files are the table's now, or orphans (tabletopic.orphans). Only while
        `node_id` leads partition 0 at `leader_epoch` (False, nothing done, otherwise): a
        deposed coordinator publishes nothing."""

        def write() -> bool:
            with self.meta._txn() as db:
                if not _leads(db, topic, 0, node_id, leader_epoch, self.meta.for_update):
                    return False
                db.executemany("DELETE FROM kafka_table_files WHERE topic=? AND partition=?"
                               " AND start_offset=? AND leader_epoch=?",
                               [(topic, *k) for k in done])
                db.execute(
                    "INSERT INTO kafka_table_progress VALUES (?,?,?,?,?) ON CONFLICT (topic)"
                    " DO UPDATE SET table_name=excluded.table_name, offsets=excluded.offsets,"
                    " snapshot_id=excluded.snapshot_id, commit_ms=excluded.commit_ms",
                    (topic, table, json.dumps({str(p): o for p, o in sorted(offsets.items())}),
                     snapshot_id, _now_ms()))
                return True

        return await self.meta._run(write)

    # -- the workers -------------------------------------------------------------------------
    async def requests(self) -> dict[str, int]:
        """The latest commit request id of every table topic."""

        def read() -> dict[str, int]:
            with self.meta._txn(read_only=True) as db:
                return {str(t): int(c) for t, c in db.execute(
                    "SELECT topic, commit_id FROM kafka_table_requests")}

        return await self.meta._run(read)

    async def answer(self, topic: str, node_id: int, commit_id: int,
                     answers: list[Answer]) -> set[int]:
        """Hand in answers to request `commit_id`, in one transaction; only the partitions this
        broker still leads at the answer's epoch are taken. Returns those partitions."""

        def write() -> set[int]:
            taken: set[int] = set()
            now = _now_ms()
            with self.meta._txn() as db:
                for a in sorted(answers, key=lambda a: a.partition):
                    if not _leads(db, topic, a.partition, node_id, a.leader_epoch,
                                  self.meta.for_update):
                        continue
                    taken.add(a.partition)
                    f = a.files
                    if f is not None:
                        db.execute(
                            f"INSERT INTO kafka_table_files({FILE_COLUMNS}) VALUES"
                            " (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (topic, partition,"
                            " start_offset, leader_epoch) DO UPDATE SET"
                            " next_offset=excluded.next_offset, node_id=excluded.node_id,"
                            " commit_id=excluded.commit_id, files=excluded.files,"
                            " records=excluded.records, dead=excluded.dead,"
                            " written_ms=excluded.written_ms",
                            (topic, a.partition, f.start, a.leader_epoch, f.next, node_id,
                             commit_id, f.files, f.records, f.dead, f.written_ms or now))
                    db.execute(
                        f"INSERT INTO kafka_table_workers({WORKER_COLUMNS}) VALUES"
                        " (?,?,?,?,?,?,?,?) ON CONFLICT (topic, partition) DO UPDATE SET"
                        " node_id=excluded.node_id, leader_epoch=excluded.leader_epoch,"
                        " answered=excluded.answered,"
                        " pending_records=excluded.pending_records,"
                        " pending_bytes=excluded.pending_bytes, updated_ms=excluded.updated_ms",
                        (topic, a.partition, node_id, a.leader_epoch, commit_id,
                         a.pending_records, a.pending_bytes, now))
            return taken

        return await self.meta._run(write)

    async def fate(self, topic: str,
                   keys: list[tuple[int, int, int]]) -> tuple[set[tuple[int, int, int]],
                                                               Progress | None]:
        """For a worker: which of its answers (partition, start, epoch) still wait, and the
        progress published (an answer gone landed if the table is at or past its end)."""

        def read() -> tuple[set[tuple[int, int, int]], Progress | None]:
            with self.meta._txn(read_only=True) as db:
                waiting = {(int(p), int(s), int(e)) for p, s, e in db.execute(
                    "SELECT partition, start_offset, leader_epoch FROM kafka_table_files"
                    " WHERE topic=?", (topic,))}
                progress = _progress(db, topic)
            return waiting & set(keys), progress[0] if progress else None

        return await self.meta._run(read)

    # -- everyone --------------------------------------------------------------------------
    async def progress(self) -> list[Progress]:
        """Every table topic's published offsets (the table's consumer groups)."""

        def read() -> list[Progress]:
            with self.meta._txn(read_only=True) as db:
                return _progress(db, None)

        return await self.meta._run(read)

    async def workers(self, topic: str | None = None) -> list[WorkerRow]:
        def read() -> list[WorkerRow]:
            where, args = ("WHERE topic=?", (topic,)) if topic is not None else ("", ())
            with self.meta._txn(read_only=True) as db:
                return [WorkerRow(str(r[0]), *(int(x) for x in r[1:])) for r in db.execute(
                    f"SELECT {WORKER_COLUMNS} FROM kafka_table_workers {where}"
                    " ORDER BY topic, partition", args)]

        return await self.meta._run(read)

    async def forget(self, topic: str) -> None:
        """A topic deleted (or its table topic turned off): drop its rows."""

        def write() -> None:
            with self.meta._txn() as db:
                for table in ("kafka_table_requests", "kafka_table_workers",
                              "kafka_table_files", "kafka_table_progress"):
                    db.execute(f"DELETE FROM {table} WHERE topic=?", (topic,))

        await self.meta._run(write)
