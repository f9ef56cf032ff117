"""A table topic's commit coordinator: runs on the broker leading partition 0, and makes one
Iceberg commit per trigger holding the data files that every partition's worker
(tabletopic.writer) wrote for it, with each partition's next offset (`floe.offsets`).

One round:
  1. when the commit interval is up, a commit request (a new id, kafka_table_requests; only
     the leader of partition 0 at its epoch may make one); workers answer with their file sets
     (broker.metadata.tablework), the ones on this broker at once. It waits for every
     partition with a leader, at most `answer_wait_s`: a partition that does not answer in
     time (its broker died, it is slow) blocks no other. File sets handed in between rounds
     are committed at once (steps 2-4 without a request): a late answer, a worker holding more
     than the topic's `commit.max.records` / `commit.max.bytes`, or one that has caught up
     with the log after taking a partition up behind its end (a table switched on over a
     backlog, a new leader; tabletopic.writer), whose rows are old already;
  2. it reads the waiting file sets and the partitions' leaders and epochs (one snapshot),
     then loads the table; for each partition it takes the chain of file sets of the
     partition's current leader epoch that starts at the table's offset
     (`floe.offsets`; a partition the table does not know starts at its first set) and runs
     on without a gap. Sets of an older epoch (a deposed leader's), behind the table, or cut
     off from it are dropped: their worker starts again from the table's offsets;
  3. one commit: a fast append of the chains' files with the new offsets
     (tabletopic.commit.prepare_files), or, for an upsert table, files written in another
     partition spec or a layout to change, the rows read back from the files and committed
     the way a single writer does (tabletopic.commit.prepare: copy-on-write needs every
     key's rows in one place);
  4. the table's offsets published, taken and dropped sets removed (`settle`), from where
     workers learn what landed and the table's consumer group reads its offsets.

Exactly once rests on step 3 alone: the commit is built from the table as loaded (each chain
starts at the table's offset) and sent under the catalog's compare-and-swap on the snapshot
(tabletopic.commit); two coordinators (a deposed one, the new) cannot both land a commit on
the same snapshot. A file set is the rows of exactly the offsets it names: its worker read
them from the log, which never changes below its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.update import (
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    TableRequirement,
    TableUpdate,
)

from broker.engine import StorageEngine
from broker.metadata.tablework import FileSet, Outstanding, TableWork
from s3stream.retry import RetryPolicy
from tabletopic.commit import (
    COMMIT_RETRY,
    Prepared,
    StaleOffsets,
    check_updates,
    offsets_after,
    prepare,
    send,
)
from tabletopic.config import TableTopicConfig
from tabletopic.contract import MAIN, OFFSETS, snapshot_summary, table_offsets
from tabletopic.datafiles import append_files, decode
from tabletopic.orphans import remove_orphan_files
from tabletopic.partitioning import stage_layout
from tabletopic.upsert import Upsert

log = logging.getLogger(__name__)
POLL_S = 0.05  # how often answers are looked for while a round waits for them
IDLE_S = 0.1  # how often a coordinator not leading partition 0 (or paused) looks again
MAX_ANSWER_WAIT_S = 5.0
# A failed step (catalog or warehouse down, a registry error, ...) is retried forever, everything
# read kept, after 0.2 s doubling to 5 s (jittered: many table topics share one catalog), back
# to 0.2 s after a step that worked; the wait ends early when the writer is stopped. The
# workers' steps (tabletopic.writer) and the coordinator's rounds alike.
WRITER_RETRY = RetryPolicy(
    max_attempts=None, base_delay=0.2, max_delay=5.0, deadline=None, jitter=0.5
)


def answer_wait_s(cfg: TableTopicConfig) -> float:
    """How long a round waits for the workers' answers: the commit interval (a worker that
    has not answered by then is late for this round anyway), between 0.5 and 5 s."""
    return min(MAX_ANSWER_WAIT_S, max(0.5, cfg.commit_interval_s))


@dataclass
class Chains:
    """What a round commits and removes."""

    start: dict[int, int] = field(default_factory=dict)
    new: dict[int, int] = field(default_factory=dict)
    sets: list[FileSet] = field(default_factory=list)
    dropped: list[FileSet] = field(default_factory=list)


def pick(out: Outstanding, offsets: dict[int, int]) -> Chains:
    """Step 2 of the module docstring: per partition, the chain of its current epoch's file
    sets from the table's offset; every other set is dropped."""
    chains = Chains()
    by_part: dict[int, list[FileSet]] = {}
    for f in out.files:
        by_part.setdefault(f.partition, []).append(f)
    for p, sets in sorted(by_part.items()):
        leader = out.leaders.get(p)
        current = [f for f in sets if leader is not None and f.leader_epoch == leader[1]]
        at = offsets.get(p)
        if at is None and current:
            at = min(f.start for f in current)
        starts = {f.start: f for f in current}
        taken: list[FileSet] = []
        while at is not None and at in starts and starts[at].next > at:
            f = starts.pop(at)
            taken.append(f)
            at = f.next
        if taken:
            chains.start[p] = taken[0].start
            chains.new[p] = taken[-1].next
            chains.sets += taken
        chains.dropped += [f for f in sets if f not in taken]
    return chains


class Coordinator:
    def __init__(
        self,
        topic: str,
        storage: StorageEngine,
        catalog: Catalog,
        work: TableWork,
        node_id: int,
        config: Callable[[], TableTopicConfig],
        on_request: Callable[[int], None],
        orphan_min_age_s: float,
    ) -> None:
        self.topic = topic
        self.storage = storage
        self.catalog = catalog
        self.work = work
        self.node_id = node_id
        self.config = config
        self.on_request = on_request  # tells this broker's worker of a new request at once
        self.orphan_min_age_s = orphan_min_age_s
        self.paused = False
        # set by the writer once the table exists (its worker creates it): no round before
        self.ready = asyncio.Event()
        self.busy = False  # a round in flight (an operation waits for it to end)
        self.epoch: int | None = None  # of partition 0 while this broker leads it
        self.commits = 0
        self.rows = 0
        self.last_commit: float | None = None
        self.last_commit_seconds: float | None = None
        self.last_error: str | None = None
        self.conflicts = 0
        self.workers: dict[int, dict[str, Any]] = {}  # as of the last round, for status
        self._next_request = 0.0
        self._next_orphan_check = 0.0
        self._published = False

    @property
    def active(self) -> bool:
        return self.epoch is not None

    async def run(self, stopped: asyncio.Event) -> None:
        """Coordinate while this broker leads partition 0 (checked every IDLE_S); errors are
        retried after WRITER_RETRY's waits."""
        tries = WRITER_RETRY.attempts(f"table topic {self.topic}: coordinator", logger=log)
        while not stopped.is_set():
            try:
                self.epoch = self.storage.led_epoch(self.topic, 0)
                if self.epoch is None or self.paused or not self.ready.is_set():
                    self._published = False
                    await _sleep(stopped, IDLE_S)
                    continue
                await self._round(stopped)
                tries.reset()
            except Exception as e:  # the catalog, the database, ...: keep going
                self.last_error = f"{type(e).__name__}: {e}"
                self.busy = False
                wait = tries.failed(e)
                assert wait is not None
                await _sleep(stopped, wait)

    async def _round(self, stopped: asyncio.Event) -> None:
        cfg = self.config()
        now = time.monotonic()
        if not self._published:  # a new coordinator: the table's offsets, as they are
            await self._commit(cfg)
            self._published = True
            self._next_request = now + cfg.commit_interval_s
        if now >= self._next_request:
            self._next_request = now + cfg.commit_interval_s
            assert self.epoch is not None
            commit_id = await self.work.request(self.topic, self.node_id, self.epoch)
            if commit_id is None:  # partition 0 moved on: not ours to coordinate
                return
            self.on_request(commit_id)
            if not await self._gather(commit_id, answer_wait_s(cfg), stopped):
                return  # partition 0 moved on (or this broker's lease lapsed) meanwhile
            await self._commit(cfg)
        else:
            out = await self.work.outstanding(self.topic)
            if out.files:  # handed in between rounds: committed at once (step 1)
                await self._commit(cfg, out)
            else:
                await _sleep(stopped, min(POLL_S * 2, max(0.0, self._next_request - now)))
        if time.monotonic() >= self._next_orphan_check:
            await self._clean_orphans(cfg)

    async def _gather(self, commit_id: int, wait_s: float, stopped: asyncio.Event) -> bool:
        """Until every partition with a leader has answered `commit_id`, or `wait_s`. False
        as soon as this broker no longer leads partition 0 at the round's epoch (it is not the
        coordinator any more: nothing to commit)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not stopped.is_set():
            if self.storage.led_epoch(self.topic, 0) != self.epoch:
                return False
            out = await self.work.outstanding(self.topic)
            led = [p for p, (node, _e) in out.leaders.items() if node >= 0]
            if all(p in out.workers and out.workers[p].answered >= commit_id for p in led):
                return True
            await _sleep(stopped, POLL_S)
        return True

    async def _commit(self, cfg: TableTopicConfig, out: Outstanding | None = None) -> None:
        """Steps 2-4. A lost race (the table moved meanwhile) reads everything again."""
        self.busy = True
        first: list[Outstanding | None] = [out]

        async def attempt() -> None:
            given, first[0] = first[0], None  # a retry reads everything again
            await self._commit_once(cfg, given)

        try:
            await replace(COMMIT_RETRY, retriable=_lost_race).run_async(
                attempt, f"table topic {self.topic}: commit", on_retry=self._conflict,
                logger=log)
        finally:
            self.busy = False

    def _conflict(self, exc: BaseException) -> None:
        self.conflicts += 1

    async def _commit_once(self, cfg: TableTopicConfig, out: Outstanding | None) -> None:
        if out is None:
            out = await self.work.outstanding(self.topic)  # before the table: see `pick`
        self._note_workers(out)
        table = await asyncio.to_thread(self.catalog.load_table, cfg.identifier)
        offsets = table_offsets(table)
        safe_ms = time.time() * 1000 - self.orphan_min_age_s * 1000 / 2
        stale = [f for f in out.files if f.written_ms < safe_ms]  # its files may be swept
        fresh = Outstanding([f for f in out.files if f not in stale], out.leaders,
                            out.workers, out.progress)
        chains = pick(fresh, offsets)
        chains.dropped += stale
        snapshot_id = table.metadata.current_snapshot_id
        if chains.sets:
            began = time.monotonic()
            landed, rows = await asyncio.to_thread(self._commit_sync, cfg, table, chains)
            self.last_commit_seconds = round(time.monotonic() - began, 3)
            if landed is not None:
                snapshot_id = landed
                offsets = {**offsets, **chains.new}
                self.commits += 1
                self.rows += rows
                self.last_commit = time.time()
        self.last_error = None
        published = out.progress.offsets if out.progress is not None else None
        done = [f.key for f in chains.sets + chains.dropped]
        if done or published != offsets or out.progress is None:
            assert self.epoch is not None
            settled = await self.work.settle(
                self.topic, f"{cfg.namespace}.{cfg.table}", offsets, snapshot_id, done,
                self.node_id, self.epoch)
            if not settled:
                log.info("table topic %s: no longer the coordinator", self.topic)

    def _commit_sync(
        self, cfg: TableTopicConfig, table: Table, chains: Chains
    ) -> tuple[int | None, int]:
        """One catalog commit of the chains; returns the new snapshot's id (None: the table
        held these offsets already) and the rows committed."""
        files: list[DataFile] = [d for f in chains.sets for d in decode(f.files)]
        rows = sum(d.record_count for d in files)
        spec_id = table.metadata.default_spec_id
        relayout = stage_layout(table.transaction(), cfg.layout)
        if cfg.upsert or relayout or any(d.spec_id != spec_id for d in files):
            data = read_rows(table, files)
            upsert = Upsert(cfg.id_columns, cfg.cdc_field) if cfg.upsert else None
            prepared = prepare(table, self.topic, data, chains.start, chains.new,
                               cfg.layout, upsert)
        else:
            prepared = prepare_files(table, self.topic, files, chains.start, chains.new)
        if prepared is None:
            return None, 0
        send(self.catalog, prepared)
        return prepared.snapshot_id, rows

    def _note_workers(self, out: Outstanding) -> None:
        self.workers = {
            p: {"partition": p, "node_id": w.node_id, "leader_epoch": w.leader_epoch,
                "answered": w.answered, "pending_records": w.pending_records}
            for p, w in sorted(out.workers.items())}

    async def _clean_orphans(self, cfg: TableTopicConfig) -> None:
        """Data files of commits that never happened (a crash, a lost race, a file set
        dropped) go after the safety age (tabletopic.orphans); the coordinator alone sweeps.
        A file set older than half that age is never committed (step 2 drops it)."""
        self._next_orphan_check = time.monotonic() + min(
            3600.0, max(60.0, self.orphan_min_age_s / 4))
        waiting = await self.work.outstanding(self.topic)  # read before the listing
        keep = frozenset(d.file_path for f in waiting.files for d in decode(f.files))
        table = await asyncio.to_thread(self.catalog.load_table, cfg.identifier)
        await asyncio.to_thread(remove_orphan_files, table, self.orphan_min_age_s, keep)

    def status(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "active": self.active, "commits": self.commits,
                "conflicts": self.conflicts, "last_error": self.last_error,
                "workers": list(self.workers.values())}


def prepare_files(
    table: Table, topic: str, files: list[DataFile], start: dict[int, int],
    new: dict[int, int],
) -> Prepared | None:
    """Like `prepare`, for rows already written as data files of this table (by the
    partitions' workers, tabletopic.datafiles) in its current partition spec: a fast append
    of `files` (none: the offsets' records all went to the dead-letter topic) and
    `floe.offsets`, under the same requirements plus the default spec id the files were
    written in."""
    checked = offsets_after(table, start, new)
    if checked is None:
        return None
    offsets, encoded = checked
    meta = table.metadata
    tx = table.transaction()
    append_files(tx, files, snapshot_summary(topic, encoded))
    tx.set_properties({OFFSETS: encoded})
    updates: tuple[TableUpdate, ...] = tx._updates
    snapshot_id = check_updates(updates, meta.current_snapshot_id, encoded, evolve=False)
    requirements: tuple[TableRequirement, ...] = (
        AssertTableUUID(uuid=meta.table_uuid),
        AssertRefSnapshotId.model_validate({"ref": MAIN, "snapshot-id": meta.current_snapshot_id}),
        AssertCurrentSchemaId.model_validate({"current-schema-id": meta.current_schema_id}),
        AssertDefaultSpecId.model_validate({"default-spec-id": meta.default_spec_id}),
    )
    return Prepared(table, updates, requirements, snapshot_id, offsets, owns_data_files=False)


def read_rows(table: Table, files: list[DataFile]) -> pa.Table | None:
    """The rows of data files written for this table (for a commit that writes them again)."""
    parts = []
    for d in files:
        with table.io.new_input(d.file_path).open() as f:
            parts.append(pq.read_table(f))
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="permissive")


def _lost_race(e: BaseException) -> bool:
    return isinstance(e, CommitFailedException | StaleOffsets)


async def _sleep(stopped: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopped.wait(), seconds)

