"""One table topic's writer on this broker: the worker of every partition the broker leads
(reads the committed log, converts records to Arrow, writes them as the table's data files
when a commit is requested), and the topic's commit coordinator while the broker leads
partition 0 (tabletopic.coordinator).

Exactly once: the table records the next offset of every partition it holds (`floe.offsets`,
a table property, and in each floe snapshot's summary); the coordinator commits a
partition's files only from that offset on, under the catalog's compare-and-swap (the
argument is in tabletopic.commit and tabletopic.coordinator). A worker starts each partition
it comes to lead (a new leader epoch) from the table's offsets, and again whenever a file
set of its was dropped (it learns it from the progress the coordinator publishes). Dead
letters are written before the file set that moves past them is handed in, so they are at
least once.

The worker's steps, per partition: read up to the last stable offset (read_committed:
aborted records and markers skipped), convert (schemas fetched from the registry), keep the
rows; on a commit request (or when it holds more than `commit.max.records` / `.bytes`, or has
caught up with the log after taking the partition up behind its end: a table switched on over
a backlog, a new leader, a restart) write them as data files of the table (the table's schema
first evolved to hold their columns, tabletopic.datafiles) and hand the file set in
(broker.metadata.tablework), only while it still leads the partition at its epoch. Taken up
behind the log's end with a backlog that fits one hand-in, the partitions are read one after
the other, and each one read to its end has its files written while the next is read
(`_write_ahead`): the hand-in takes those files (a write ahead that failed: its tables are
written again; files never handed in are orphans, swept by age).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from broker.engine import StorageEngine
from broker.errors import KafkaError
from broker.metadata.tablework import Answer, FileSet, TableWork
from broker.protocol.recordcodec import Record
from broker.protocol.records import BatchHeader
from tabletopic.columnar import Columns, Parts, decode_columns, joined
from tabletopic.commit import StaleOffsets, covers
from tabletopic.config import ORPHAN_MIN_AGE_S, TableTopicConfig
from tabletopic.contract import table_offsets
from tabletopic.contract import table_properties as floe_table_properties
from tabletopic.convert import Converter, Invalid
from tabletopic.coordinator import WRITER_RETRY, Coordinator
from tabletopic.datafiles import encode, evolve_schema, write_data_files
from tabletopic.dlq import DeadLetters
from tabletopic.keyconvert import KeyedConverter, ValueConverter, converter, schema_parts
from tabletopic.schemaconvert import SchemaById
from tabletopic.schemafetch import fetch_schemas
from tabletopic.txnfilter import committed_batches

__all__ = ["StaleOffsets", "TableWriter"]
log = logging.getLogger(__name__)
READ_BYTES = 4 << 20
# a read the C path declines: its first HEAD_ROWS rows in Python, the rest offered to the C
# path again once they are in (a new table's columns come from its first rows)
HEAD_ROWS = 1000
MAX_PENDING_BYTES = 512 << 20  # stop reading ahead while file sets cannot be handed in
FATE_CHECK_S = 0.1  # how often a worker with file sets waiting looks whether they landed
# Table properties a table topic's table is created with (one that exists keeps its own).
# Parquet's dictionary page limit, Iceberg's default 2 MiB: until a column's dictionary
# reaches it, Arrow holds the column's encoded pages (the dictionary page goes first), which
# cost ~50 MiB of memory per partition's write of 135k JSON rows, ~15 at 256 KiB, and the
# writes were twice as slow (benchmarks/README.md, tablebacklog). A column with more distinct
# values than fit 256 KiB is written plain (zstd still compresses it).
NEW_TABLE_PROPERTIES = {"write.parquet.dict-size-bytes": str(256 << 10)}


@dataclass
class Ahead:
    """Data files of a partition's first `tables` tables, written while other partitions were
    still read (`_write_ahead`); the hand-in takes them."""

    tables: int
    began_ms: int  # the files' age counts from here (orphans, the coordinator's stale check)
    task: asyncio.Future[list[Any]]


@dataclass
class PartitionState:
    partition: int
    committed: int  # the table holds every offset below this (as far as this worker knows)
    read_next: int  # next offset to read from the log
    epoch: int = 0  # the leader epoch this broker leads the partition at
    flushed: int = -1  # the end of the last file set handed in (-1: committed)
    waiting: list[tuple[int, int]] = field(default_factory=list)  # sets handed in: (start, next)
    tables: list[pa.Table] = field(default_factory=list)
    dead: list[Invalid] = field(default_factory=list)
    records: int = 0
    bytes: int = 0
    stopped: str | None = None  # errors.tolerance=none: why this partition stopped
    # taken up behind the log's end (a table switched on over a backlog, a new leader, a
    # restart): its rows are handed in as soon as it has read up to the end (`_caught_up`)
    catching_up: bool = False
    ahead: Ahead | None = None  # its tables' files under way, ahead of the hand-in

    def __post_init__(self) -> None:
        if self.flushed < 0:
            self.flushed = self.committed


class TableWriter:
    def __init__(
        self,
        topic: str,
        storage: StorageEngine,
        catalog: Catalog,
        work: TableWork,
        node_id: int = 0,
        orphan_min_age_s: float = ORPHAN_MIN_AGE_S,
        schemas: SchemaById | None = None,
    ) -> None:
        """schemas: the Schema Registry (by_schema_id / by_latest_schema); None when off."""
        self.topic = topic
        self.schemas = schemas
        self.storage = storage
        self.catalog = catalog
        self.work = work
        self.node_id = node_id
        self.parts: dict[int, PartitionState] = {}  # the partitions this broker leads
        self.converter: ValueConverter | KeyedConverter | None = None
        self.dlq: DeadLetters | None = None
        self.last_error: str | None = None
        self.requested = 0  # the latest commit request seen
        self.answered = 0  # the latest one answered
        self._poke = asyncio.Event()  # a new request, or new progress published
        self._stop = asyncio.Event()
        self._next_fate_check = 0.0
        self.writes_ahead = 0  # partitions' files written ahead of a hand-in (/status)
        # steps retried after an error (WRITER_RETRY), commits rebuilt after a lost race
        self.retries = {"error": 0, "commit_conflict": 0}
        # tabletopic.ops: why an operator or an operation paused this writer (None: running);
        # `idle` once it holds nothing, so that a rollback or rebuild can rewrite the table
        self._paused: str | None = None
        self._idle = False
        self.coordinator = Coordinator(topic, storage, catalog, work, node_id,
                                       lambda: self.config, self.request_seen,
                                       orphan_min_age_s)

    @property
    def config(self) -> TableTopicConfig:
        return TableTopicConfig.of(self.topic, self.storage.topic(self.topic).config)

    @property
    def paused(self) -> str | None:
        return self._paused

    @paused.setter
    def paused(self, why: str | None) -> None:
        self._paused = why
        self.coordinator.paused = why is not None

    @property
    def idle(self) -> bool:
        return self._idle and not self.coordinator.busy

    # the coordinator's figures, for status, freshness and the operations
    @property
    def commits(self) -> int:
        return self.coordinator.commits

    @property
    def rows(self) -> int:
        return self.coordinator.rows

    @property
    def last_commit(self) -> float | None:
        return self.coordinator.last_commit

    @property
    def last_commit_seconds(self) -> float | None:
        return self.coordinator.last_commit_seconds

    def stop(self) -> None:
        self._stop.set()

    def request_seen(self, commit_id: int) -> None:
        """A commit request (from the manager's poll, or this broker's coordinator)."""
        if commit_id > self.requested:
            self.requested = commit_id
            self._poke.set()

    async def run(self) -> None:
        coordinating = asyncio.create_task(self.coordinator.run(self._stop),
                                           name=f"table-coordinator {self.topic}")
        try:
            await self._work()
        finally:
            coordinating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await coordinating

    async def _work(self) -> None:
        tries = WRITER_RETRY.attempts(
            f"table topic {self.topic}", on_retry=self._retried, logger=log
        )
        while not self._stop.is_set():
            if self.paused is not None:  # resumed, it starts again from the table's offsets
                self.converter, self._idle = None, True  # parts kept for status until then
                if any(s.waiting for s in self.parts.values()) \
                        and time.monotonic() >= self._next_fate_check:
                    with contextlib.suppress(Exception):  # status only: retried next time
                        await self._check_fate()  # sets handed in before the pause landed?
                await self._sleep(0.05)
                continue
            self._idle = False
            try:
                if self.converter is None:
                    await self._start()
                await self._adopt()
                progressed = await self._read()
                if self.parts and any(s.waiting for s in self.parts.values()) \
                        and time.monotonic() >= self._next_fate_check:
                    await self._check_fate()
                if self._answer_due():
                    await self._answer()
                elif not progressed:
                    await self._wait()
                tries.reset()
            except KafkaError as e:
                if e.code.name == "unknown_topic_or_partition":
                    return  # the topic is gone
                if e.code.name != "not_leader_or_follower":
                    raise
                # a partition moved to another broker, or this broker's lease lapsed while
                # the metadata database was unreachable: the next _adopt sees it
                self.last_error = f"{type(e).__name__}: {e}"
                wait = tries.failed(e)
                assert wait is not None
                await self._sleep(wait)
            except Exception as e:  # catalog or warehouse down, ...: keep everything, retry
                self.last_error = f"{type(e).__name__}: {e}"
                wait = tries.failed(e)
                assert wait is not None  # WRITER_RETRY retries every error, forever
                await self._sleep(wait)

    def _retried(self, exc: BaseException) -> None:
        self.retries["error"] += 1

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    # -- start: the table, and the partitions this broker leads ------------------------------
    async def _start(self) -> None:
        cfg = self.config
        table = await asyncio.to_thread(self._load_or_create, cfg)
        self.converter = converter(cfg, table.schema().as_arrow())
        self.dlq = DeadLetters(self.storage, cfg.dlq_topic, self.topic)
        await self.dlq.load()
        self.parts = {}
        self.coordinator.ready.set()
        log.info("table topic %s -> %s.%s: broker %d writes its partitions", self.topic,
                 cfg.namespace, cfg.table, self.node_id)

    def _load_or_create(self, cfg: TableTopicConfig) -> Table:
        self.catalog.create_namespace_if_not_exists(cfg.namespace)
        try:
            return self.catalog.load_table(cfg.identifier)
        except NoSuchTableError:
            schema = converter(cfg).schema()
            return self.catalog.create_table_if_not_exists(
                cfg.identifier,
                schema=schema,
                properties={**NEW_TABLE_PROPERTIES, **floe_table_properties(self.topic),
                            "format-version": "2"},
            )

    async def _adopt(self) -> None:
        """Take up the partitions this broker has come to lead (or leads at a new epoch), from
        the table's offsets; drop those it no longer leads (what they held is another
        leader's work now)."""
        count = len(self.storage.topic(self.topic).streams)
        fresh: dict[int, int] = {}
        for p in range(count):
            epoch = self.storage.led_epoch(self.topic, p)
            st = self.parts.get(p)
            if epoch is None:
                if st is not None:
                    del self.parts[p]
            elif st is None or st.epoch != epoch:
                fresh[p] = epoch
        if not fresh:
            return
        table = await asyncio.to_thread(self.catalog.load_table, self.config.identifier)
        offsets = table_offsets(table)
        for p, epoch in fresh.items():
            start, end = self.storage.offsets(self.topic, p)
            committed = offsets.get(p, start)
            read_next = max(committed, start)
            self.parts[p] = PartitionState(p, committed, read_next, epoch,
                                           catching_up=read_next < end)
        log.info("table topic %s: broker %d writes partitions %s from offsets %s", self.topic,
                 self.node_id, sorted(fresh), {p: self.parts[p].committed for p in fresh})

    async def _check_fate(self) -> None:
        """Which handed-in file sets landed (the table is past them) and which were dropped
        (the partition starts again from the table's offsets)."""
        self._next_fate_check = time.monotonic() + FATE_CHECK_S
        keys = [(p, start, st.epoch) for p, st in self.parts.items() for start, _n in st.waiting]
        waiting, progress = await self.work.fate(self.topic, keys)
        offsets = dict(progress.offsets) if progress is not None else {}
        for p, st in list(self.parts.items()):
            if self.parts.get(p) is not st:
                continue
            left = []
            for start, nxt in st.waiting:
                if (p, start, st.epoch) in waiting:
                    left.append((start, nxt))
                elif offsets.get(p, -1) >= nxt:
                    st.committed = max(st.committed, nxt)
                else:  # dropped: start again from the table's offsets (the next _adopt)
                    log.info("table topic %s: file set %d-%d of partition %d was not"
                             " committed; again from the table's offsets", self.topic, start,
                             nxt, p)
                    del self.parts[p]
                    break
            else:
                st.waiting = left

    # -- reading and converting -------------------------------------------------------------
    async def _read(self) -> bool:
        assert self.converter is not None
        cfg = self.config
        progressed = False
        one_by_one = self._one_by_one()
        for st in list(self.parts.values()):
            if st.stopped or sum(s.bytes for s in self.parts.values()) > MAX_PENDING_BYTES:
                continue
            if one_by_one is not None and st.catching_up and st is not one_by_one:
                continue
            # read_committed: up to the last stable offset, aborted records and markers skipped
            lso = self.storage.last_stable_offset(self.topic, st.partition)
            if st.read_next >= lso:
                continue
            # the batches as the cache holds them, not joined (tabletopic.columnar.Parts)
            data = Parts((await self.storage.read_records(
                self.topic, st.partition, st.read_next, READ_BYTES, must_return_one=True
            )).parts)
            got = committed_batches(
                self.storage, self.topic, st.partition, data, st.read_next, lso
            )
            if got is None:
                continue
            last = got.next_offset
            conv = self.converter
            if isinstance(conv, Converter):  # columns all the way (tabletopic.columnar)
                table, dead, first = await asyncio.to_thread(
                    _convert_columns, conv, st.partition, data, got.batches, st.read_next,
                    cfg.tolerance == "none")
            else:
                recs = await asyncio.to_thread(_decode_records, data, got.batches, st.read_next)
                for sconv, conv_recs, subject in schema_parts(conv, recs, cfg):
                    await fetch_schemas(self.schemas, sconv, conv_recs, subject)
                table, dead = await asyncio.to_thread(conv.convert, st.partition, recs)
                first = None
                if dead and cfg.tolerance == "none":
                    first = dead[0]
                    keep = [r for r in recs if r.offset < first.record.offset]
                    table, _ = await asyncio.to_thread(conv.convert, st.partition, keep)
                    dead = []
            if first is not None:
                st.stopped = (f"offset {first.record.offset}: {first.reason}"
                              " (errors.tolerance=none)")
                last = first.record.offset
            if self.parts.get(st.partition) is not st:
                continue  # dropped meanwhile
            if table is not None:
                st.tables.append(table)
                st.records += table.num_rows
                st.bytes += table.nbytes
            st.dead += dead
            st.read_next = last
            progressed = True
            if st is one_by_one and self._read_to_end(st) and st.tables and st.ahead is None \
                    and self._one_by_one() is not None:
                self._write_ahead(st)  # while the next partition is read
        return progressed

    def _one_by_one(self) -> PartitionState | None:
        """When every partition taken up behind the log's end fits one hand-in (its records
        within `commit.max.records`), they are read one after the other: this is the one to
        read (the first not read to its end; None: read them all in turn). Each one read to
        its end has its Parquet written while the next is read (`_write_ahead`)."""
        ups = [s for s in self.parts.values() if s.catching_up]
        if not ups:
            return None
        behind = sum(self.storage.last_stable_offset(self.topic, s.partition) - s.read_next
                     for s in ups if not s.stopped)
        pending = sum(s.records for s in self.parts.values() if s.read_next > s.flushed)
        if behind + pending > self.config.commit_max_records:
            return None
        return next((s for s in ups if not self._read_to_end(s)), None)

    def _write_ahead(self, st: PartitionState) -> None:
        """Start writing the partition's tables as data files (in a thread) before its
        hand-in, which takes them. Should the write fail, the hand-in writes those tables
        again (what it wrote is an orphan); a partition dropped before its hand-in leaves its
        files to the orphan sweep."""
        data = pa.concat_tables(st.tables, promote_options="permissive")
        cfg = self.config

        def write() -> list[Any]:
            table = evolve_schema(self.catalog, cfg.identifier, data.schema)
            return write_data_files(table, data, cfg.layout.sort_by)

        task = asyncio.ensure_future(asyncio.to_thread(write))
        task.add_done_callback(_retrieve)
        st.ahead = Ahead(len(st.tables), int(time.time() * 1000), task)
        self.writes_ahead += 1

    # -- handing file sets in ---------------------------------------------------------------
    def _answer_due(self) -> bool:
        if self.requested > self.answered:
            return True
        cfg = self.config
        pending = [s for s in self.parts.values() if s.read_next > s.flushed]
        return bool(pending) and (
            sum(s.records for s in pending) >= cfg.commit_max_records
            or sum(s.bytes for s in pending) >= cfg.commit_max_bytes
            or self._caught_up())

    def _caught_up(self) -> bool:
        """Every partition taken up behind the log's end has read up to its last stable
        offset (or stopped): what it read is handed in now, not at the next request (the
        coordinator commits file sets handed in between rounds at once). Once per take-up:
        after that, rows wait for the requests as usual."""
        ups = [s for s in self.parts.values() if s.catching_up]
        return bool(ups) and all(self._read_to_end(s) for s in ups)

    def _read_to_end(self, st: PartitionState) -> bool:
        """The partition has read up to its last stable offset, or stopped."""
        return bool(st.stopped) or st.read_next >= self.storage.last_stable_offset(
            self.topic, st.partition)

    async def _wait(self) -> None:
        keys = [(self.topic, p) for p, s in self.parts.items() if not s.stopped]
        self._poke.clear()
        data = asyncio.ensure_future(self.storage.wait_for_data(keys, 0.5))
        poke = asyncio.ensure_future(self._poke.wait())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([data, poke, stop], timeout=0.5,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (data, poke, stop):
                t.cancel()
            await asyncio.gather(data, poke, stop, return_exceptions=True)

    async def _answer(self) -> None:
        """Write what every led partition holds as data files (dead letters first) and hand
        the file sets in for the latest request, with the partitions that hold nothing."""
        assert self.dlq is not None
        cfg = self.config
        commit_id = self.requested
        parts = list(self.parts.values())
        if not parts:  # this broker leads no partition of the topic
            self.answered = max(self.answered, commit_id)
            return
        # the schema first, partition by partition (each writes with the table as it was
        # once its rows were covered); then every partition's files at once, in threads
        # (Arrow writes Parquet without the GIL: the partitions' writes overlap)
        # files written ahead (`_write_ahead`) are taken as they are, the tables read after
        # them written now; a partition whose write ahead failed writes all its tables
        writes: list[tuple[PartitionState, Table | None, pa.Table | None, Ahead | None]] = []
        table: Table | None = None
        for st in parts:
            if st.read_next <= st.flushed:
                continue
            if st.dead:  # durable before the offsets move past them
                await self.dlq.write(st.partition, st.dead)
            ahead = st.ahead if await _landed(st.ahead) else None
            rest = st.tables[ahead.tables:] if ahead is not None else st.tables
            data = None
            if rest:
                data = pa.concat_tables(rest, promote_options="permissive")
                if table is None or not covers(table, data.schema):
                    table = await asyncio.to_thread(
                        evolve_schema, self.catalog, cfg.identifier, data.schema)
            writes.append((st, table, data, ahead))
        written = await asyncio.gather(*(self._write_files(t, d, a) for _st, t, d, a in writes))
        sets = {  # partition -> the file set it hands in
            st.partition: FileSet(self.topic, st.partition, st.flushed, st.epoch, st.read_next,
                                  self.node_id, commit_id, files, st.records, len(st.dead),
                                  began_ms)
            for (st, _t, _d, _a), (files, began_ms) in zip(writes, written, strict=True)}
        answers = [
            Answer(st.partition, st.epoch, sets.get(st.partition),
                   0 if st.partition in sets else st.records,
                   0 if st.partition in sets else st.bytes)
            for st in parts]
        taken = await self.work.answer(self.topic, self.node_id, commit_id, answers)
        for st in parts:
            if self.parts.get(st.partition) is not st:
                continue
            if st.partition not in taken:  # not the leader at this epoch any more
                del self.parts[st.partition]
                continue
            if st.partition in sets:
                through = sets[st.partition].next
                st.waiting.append((st.flushed, through))
                st.flushed = through
                st.tables, st.dead, st.records, st.bytes, st.ahead = [], [], 0, 0, None
            if st.catching_up and self._read_to_end(st):
                st.catching_up = False  # handed in (or nothing more to read): caught up
        self.answered = max(self.answered, commit_id)
        self._next_fate_check = 0.0

    async def _write_files(self, table: Table | None, data: pa.Table | None,
                           ahead: Ahead | None) -> tuple[str, int]:
        """The files written ahead and those of `data` (none without rows), encoded, and when
        the first of them was begun."""
        began_ms = int(time.time() * 1000)  # the files' age counts from here (orphans)
        files: list[Any] = []
        if ahead is not None:
            files += ahead.task.result()
            began_ms = min(began_ms, ahead.began_ms)
        if data is not None:
            assert table is not None
            files += await asyncio.to_thread(
                write_data_files, table, data, self.config.layout.sort_by)
        return encode(files), began_ms

    # -- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        cfg = self.config
        now = time.time()
        parts = []
        for p, s in sorted(self.parts.items()):
            try:
                _start, end = self.storage.offsets(self.topic, p)
                acked = (
                    self.storage.commit_time(self.topic, p, s.committed)
                    if s.committed < end
                    else None
                )
            except KafkaError:
                continue
            parts.append(
                {
                    "partition": p,
                    "writer_node": self.node_id,
                    "leader_epoch": s.epoch,
                    "log_end_offset": end,
                    "committed_offset": s.committed,
                    "lag_records": end - s.committed,
                    "lag_seconds": round(now - acked, 3) if acked is not None else 0.0,
                    "pending_records": s.records,
                    "dead_letters_pending": len(s.dead),
                    "file_sets_waiting": len(s.waiting),
                    "stopped": s.stopped,
                }
            )
        return {
            "topic": self.topic,
            "table": f"{cfg.namespace}.{cfg.table}",
            "value_type": cfg.value_type,
            "node_id": self.node_id,
            "commits": self.commits,
            "rows": self.rows,
            "dead_letters": self.dlq.count if self.dlq else 0,
            "dlq_topic": cfg.dlq_topic,
            "last_commit": self.last_commit,
            "last_error": self.last_error or self.coordinator.last_error,
            "paused": self.paused,
            "retries": {**self.retries, "commit_conflict": self.coordinator.conflicts},
            "writes_ahead": self.writes_ahead,
            "coordinator": self.coordinator.status(),
            "partitions": parts,
        }


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A write ahead's outcome is read here too (one whose partition was dropped before its
    hand-in is never awaited)."""
    if not task.cancelled():
        task.exception()


async def _landed(ahead: Ahead | None) -> bool:
    """Whether the write ahead (if any) succeeded; waits for it."""
    if ahead is None:
        return False
    try:
        await asyncio.shield(ahead.task)
    except asyncio.CancelledError:
        if not ahead.task.cancelled():
            raise  # we were cancelled, not the write
        return False
    except Exception as e:
        log.warning("a write ahead failed (its tables are written again): %r", e)
        return False
    return True


def _decode_records(data: Parts, batches: list[BatchHeader], offset: int) -> list[Record]:
    return decode_columns(data.tobytes(), batches, offset).records()


def _convert_columns(
    conv: Converter, partition: int, data: bytes | Parts, batches: list[BatchHeader],
    offset: int, stop_at_invalid: bool,
) -> tuple[pa.Table | None, list[Invalid], Invalid | None]:
    """Decode and convert one read (in a worker thread): the table, the dead letters and, with
    errors.tolerance=none, the first invalid record (the table then holds the rows before it,
    and there are no dead letters)."""
    table = conv.convert_batches(partition, data, batches, offset)  # C, without the GIL
    if table is not None:
        return table, [], None
    cols = decode_columns(joined(data), batches, offset)
    if len(cols) <= HEAD_ROWS:
        return _convert_python(conv, partition, cols, stop_at_invalid)
    # the first rows in Python (a new table's first read brings its columns), then the rest
    # by the C path if it takes them, else in Python too: as two reads would give them
    after = cols.offsets[HEAD_ROWS]
    table, dead, first = _convert_python(conv, partition, cols.before(after), stop_at_invalid)
    if first is not None:
        return table, dead, first  # stopped within the first rows
    rest = conv.convert_batches(partition, data, batches, after)
    if rest is None:
        rest, more, first = _convert_python(
            conv, partition, cols.take(list(range(HEAD_ROWS, len(cols)))), stop_at_invalid)
        dead += more
    if rest is not None:
        table = rest if table is None else pa.concat_tables([table, rest],
                                                            promote_options="permissive")
    return table, dead, first


def _convert_python(
    conv: Converter, partition: int, cols: Columns, stop_at_invalid: bool,
) -> tuple[pa.Table | None, list[Invalid], Invalid | None]:
    table, dead = convert_isolating(conv, partition, cols)
    if dead and stop_at_invalid:
        first = dead[0]
        table, _ = convert_isolating(conv, partition, cols.before(first.record.offset))
        return table, [], first
    return table, dead, None


def convert_isolating(
    conv: Converter, partition: int, cols: Columns
) -> tuple[pa.Table | None, list[Invalid]]:
    """conv.convert_columns, and if it raises (a record that trips a bug in the conversion:
    it is pure, so the batch would fail the same way at every retry and the partition's table
    stop there), record by record: a record whose conversion raises is a dead letter saying
    so, the others are rows as usual. If no record converts alone, the fault is not one
    record's: the batch's exception is raised (the writer retries; nothing is dead-lettered
    for a fault of the conversion itself)."""
    try:
        return conv.convert_columns(partition, cols)
    except Exception as e:
        first = e
        log.warning("converting %d records of partition %d failed (%r): again one by one, those"
                    " that fail go to the dead letters", len(cols), partition, e)
    tables: list[pa.Table] = []
    dead: list[Invalid] = []
    failed = 0
    for i in range(len(cols)):
        one = cols.take([i])
        try:
            table, bad = conv.convert_columns(partition, one)
        except Exception as e:
            failed += 1
            dead.append(Invalid(one.record(0), f"conversion failed: {type(e).__name__}: {e}"))
            continue
        dead += bad
        if table is not None:
            tables.append(table)
    if failed == len(cols):
        raise first
    if not tables:
        return None, dead
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks(), dead
