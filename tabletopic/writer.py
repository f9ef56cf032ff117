"""One table topic's writer: follows every partition's committed log, converts records to
Arrow, and commits them to the Iceberg table, exactly once.

Exactly once: the table records the next offset of every partition it holds (`floe.offsets`,
a table property, and in each floe snapshot's summary). Each commit covers the offsets between
the table's `floe.offsets` as read and the new ones, and is guarded by explicit catalog
requirements (table UUID, current snapshot id, schema id of the state it read); every commit,
one whose records all went to the dead-letter topic included, adds a snapshot. The argument is
in tabletopic.commit. After a crash, a restart or a lost race (StaleOffsets) the writer resumes
from the table's offsets. Dead letters are written before the commit that moves past them, so
they are at least once.
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
from broker.protocol.recordcodec import Record
from broker.schemaregistry.errors import RegistryError
from s3stream.retry import RetryPolicy
from tabletopic.commit import StaleOffsets, commit_offsets, table_offsets
from tabletopic.config import TableTopicConfig
from tabletopic.contract import OFFSETS
from tabletopic.contract import table_properties as floe_table_properties
from tabletopic.convert import Invalid
from tabletopic.dlq import DeadLetters
from tabletopic.keyconvert import KeyedConverter, ValueConverter, converter, schema_parts
from tabletopic.orphans import ORPHAN_MIN_AGE_S, remove_orphan_files
from tabletopic.schemaconvert import SchemaById, SchemaConverter, StoredSchemaLike
from tabletopic.txnfilter import committed_records
from tabletopic.upsert import Upsert

__all__ = ["OFFSETS", "StaleOffsets", "TableWriter", "table_offsets"]
log = logging.getLogger(__name__)
READ_BYTES = 4 << 20
MAX_PENDING_BYTES = 512 << 20  # stop reading ahead while commits cannot go through
# A failed step (catalog or warehouse down, a registry error, ...) is retried forever, everything
# read kept, after 0.2 s doubling to 5 s (jittered: many table topics share one catalog), back
# to 0.2 s after a step that worked; the wait ends early when the writer is stopped.
WRITER_RETRY = RetryPolicy(
    max_attempts=None, base_delay=0.2, max_delay=5.0, deadline=None, jitter=0.5
)


@dataclass
class PartitionState:
    partition: int
    committed: int  # the table holds every offset below this
    read_next: int  # next offset to read from the log
    tables: list[pa.Table] = field(default_factory=list)
    dead: list[Invalid] = field(default_factory=list)
    records: int = 0
    bytes: int = 0
    stopped: str | None = None  # errors.tolerance=none: why this partition stopped


class TableWriter:
    def __init__(
        self,
        topic: str,
        storage: StorageEngine,
        catalog: Catalog,
        orphan_min_age_s: float = ORPHAN_MIN_AGE_S,
        schemas: SchemaById | None = None,
    ) -> None:
        """schemas: the Schema Registry (by_schema_id / by_latest_schema); None when off."""
        self.topic = topic
        self.schemas = schemas
        self.orphan_min_age_s = orphan_min_age_s
        self._next_orphan_check = 0.0
        self.storage = storage
        self.catalog = catalog
        self.parts: dict[int, PartitionState] = {}
        self.converter: ValueConverter | KeyedConverter | None = None
        self.dlq: DeadLetters | None = None
        self.last_commit: float | None = None
        self.last_error: str | None = None
        self.commits = 0
        self.rows = 0
        self._next_commit = 0.0
        self._stop = asyncio.Event()
        # steps retried after an error (WRITER_RETRY), commits rebuilt after a lost race
        self.retries = {"error": 0, "commit_conflict": 0}
        # tabletopic.ops: why an operator or an operation paused this writer (None: running);
        # `idle` once it holds nothing, so that a rollback or rebuild can rewrite the table
        self.paused: str | None = None
        self.idle = False
        self.last_commit_seconds: float | None = None  # Parquet written + catalog commit

    @property
    def config(self) -> TableTopicConfig:
        return TableTopicConfig.of(self.topic, self.storage.topic(self.topic).config)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        tries = WRITER_RETRY.attempts(
            f"table topic {self.topic}", on_retry=self._retried, logger=log
        )
        while not self._stop.is_set():
            if self.paused is not None:  # resumed, it starts again from the table's offsets
                self.converter, self.idle = None, True
                await self._sleep(0.05)
                continue
            self.idle = False
            try:
                if self.converter is None:
                    await self._start()
                progressed = await self._read()
                if time.monotonic() >= self._next_orphan_check:
                    await self._clean_orphans()
                if self._commit_due():
                    await self._commit()
                elif not progressed:
                    await self._wait()
                tries.reset()
            except StaleOffsets as e:
                log.warning(
                    "table topic %s: %s; restarting from the table's offsets", self.topic, e
                )
                self.converter = None
            except KafkaError as e:
                if e.code.name == "unknown_topic_or_partition":
                    return  # the topic is gone
                if e.code.name != "not_leader_or_follower":
                    raise
                # a partition led by another broker (broker.cluster), or this broker's lease
                # lapsed while the metadata database was unreachable: keep everything, retry
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

    def _commit_conflict(self, exc: BaseException) -> None:
        self.retries["commit_conflict"] += 1  # from the commit's thread: a statistic

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    # -- start: the table and where it stands -----------------------------------------------
    async def _start(self) -> None:
        cfg = self.config
        table = await asyncio.to_thread(self._load_or_create, cfg)
        offsets = table_offsets(table)
        known = table.schema().as_arrow()
        self.converter = converter(cfg, known)
        self.dlq = DeadLetters(self.storage, cfg.dlq_topic, self.topic)
        await self.dlq.load()
        self.parts = {}
        for p in range(len(self.storage.topic(self.topic).streams)):
            start, _end = self.storage.offsets(self.topic, p)
            committed = offsets.get(p, start)
            self.parts[p] = PartitionState(p, committed, max(committed, start))
        self._next_commit = time.monotonic() + cfg.commit_interval_s
        log.info(
            "table topic %s -> %s.%s from offsets %s",
            self.topic,
            cfg.namespace,
            cfg.table,
            {p: s.read_next for p, s in self.parts.items()},
        )

    def _load_or_create(self, cfg: TableTopicConfig) -> Table:
        self.catalog.create_namespace_if_not_exists(cfg.namespace)
        try:
            return self.catalog.load_table(cfg.identifier)
        except NoSuchTableError:
            schema = converter(cfg).schema()
            return self.catalog.create_table_if_not_exists(
                cfg.identifier,
                schema=schema,
                properties={**floe_table_properties(self.topic), "format-version": "2"},
            )

    async def _clean_orphans(self) -> None:
        """Data files of commits that never happened (a crash, a lost race) go after the
        safety age (tabletopic.orphans); checked at start, then every quarter of the age
        (between a minute and an hour)."""
        self._next_orphan_check = time.monotonic() + min(
            3600.0, max(60.0, self.orphan_min_age_s / 4)
        )
        table = await asyncio.to_thread(self.catalog.load_table, self.config.identifier)
        await asyncio.to_thread(remove_orphan_files, table, self.orphan_min_age_s)

    # -- reading and converting -------------------------------------------------------------
    async def _read(self) -> bool:
        assert self.converter is not None
        cfg = self.config
        progressed = False
        for p in range(len(self.parts), len(self.storage.topic(self.topic).streams)):
            start, _end = self.storage.offsets(self.topic, p)  # a partition added since
            self.parts[p] = PartitionState(p, start, start)
        for st in self.parts.values():
            if st.stopped or sum(s.bytes for s in self.parts.values()) > MAX_PENDING_BYTES:
                continue
            # read_committed: up to the last stable offset, aborted records and markers skipped
            lso = self.storage.last_stable_offset(self.topic, st.partition)
            if st.read_next >= lso:
                continue
            data = await self.storage.read(
                self.topic, st.partition, st.read_next, READ_BYTES, must_return_one=True
            )
            got = committed_records(
                self.storage, self.topic, st.partition, data, st.read_next, lso
            )
            if got is None:
                continue
            recs, last = got.records, got.next_offset
            for conv, conv_recs, subject in schema_parts(self.converter, recs, cfg):
                await self._fetch_schemas(conv, conv_recs, subject)
            table, dead = await asyncio.to_thread(self.converter.convert, st.partition, recs)
            if dead and cfg.tolerance == "none":
                first = dead[0].record.offset
                keep = [r for r in recs if r.offset < first]
                table, _ = await asyncio.to_thread(self.converter.convert, st.partition, keep)
                st.stopped = f"offset {first}: {dead[0].reason} (errors.tolerance=none)"
                last = first
                dead = []
            if table is not None:
                st.tables.append(table)
                st.records += table.num_rows
                st.bytes += table.nbytes
            st.dead += dead
            st.read_next = last
            progressed = True
        return progressed

    async def _fetch_schemas(
        self, conv: SchemaConverter, recs: list[Record], subject: str
    ) -> None:
        """Give the converter every writer schema these records need: their ids (by_schema_id)
        or the subject's latest version (by_latest_schema), with the schemas they reference.
        What the registry does not hold (40401/40402/40403) or a registry that is off makes
        those records invalid (the reason goes to the DLQ); any other registry error is
        raised: the writer retries, nothing is lost."""
        if conv.value_type == "by_latest_schema":
            if self.schemas is None:
                conv.latest, conv.latest_error = None, "the schema registry is off"
                return
            try:
                latest = (await self.schemas.get_version(subject, "latest")).schema
            except RegistryError as e:
                if e.code not in (40401, 40402):
                    raise
                conv.latest, conv.latest_error = None, f"no schema for subject {subject!r}"
                return
            if latest.id not in conv.schemas:
                await self._add_schema(conv, latest)
            conv.latest = latest.id
            return
        for sid in sorted(conv.missing_ids(recs)):
            if self.schemas is None:
                conv.add_unknown(sid, "the schema registry is off (--schema-registry)")
                continue
            try:
                s = await self.schemas.get_by_id(sid)
            except RegistryError as e:
                if e.code != 40403:
                    raise
                conv.add_unknown(sid, "not in the schema registry")
                continue
            await self._add_schema(conv, s)

    async def _add_schema(self, conv: SchemaConverter, s: StoredSchemaLike) -> None:
        """Hand a schema to the converter with its references, dependencies first."""
        registry = self.schemas
        assert registry is not None
        deps: list[tuple[str, str]] = []
        seen: set[int] = set()

        async def walk(refs: tuple[Any, ...], depth: int) -> None:
            for ref in refs:
                if depth > 32:
                    raise RegistryError(422, 42201, "references nested too deeply")
                target = (await registry.get_version(ref.subject, str(ref.version))).schema
                if target.id not in seen:
                    seen.add(target.id)
                    await walk(target.references, depth + 1)
                    deps.append((ref.name, target.schema))

        try:
            await walk(s.references, 0)
        except RegistryError as e:
            if e.code not in (40401, 40402, 42201):
                raise
            conv.add_unknown(s.id, f"a reference cannot be read: {e}")
            return
        conv.add_schema(s.id, s.schema_type, s.schema, deps)

    def _commit_due(self) -> bool:
        cfg = self.config
        pending = [s for s in self.parts.values() if s.read_next > s.committed]
        if not pending:
            self._next_commit = time.monotonic() + cfg.commit_interval_s
            return False
        return (
            time.monotonic() >= self._next_commit
            or sum(s.records for s in pending) >= cfg.commit_max_records
            or sum(s.bytes for s in pending) >= cfg.commit_max_bytes
        )

    async def _wait(self) -> None:
        timeout = max(0.01, min(0.5, self._next_commit - time.monotonic()))
        keys = [(self.topic, p) for p, s in self.parts.items() if not s.stopped]
        await self.storage.wait_for_data(keys, timeout)

    # -- committing ------------------------------------------------------------------------
    async def _commit(self) -> None:
        assert self.dlq is not None
        parts = [s for s in self.parts.values() if s.read_next > s.committed]
        for s in parts:  # dead letters first: durable before the offsets move past them
            if s.dead:
                await self.dlq.write(s.partition, s.dead)
        tables = [t for s in parts for t in s.tables]
        data = pa.concat_tables(tables, promote_options="permissive") if tables else None
        start = {s.partition: s.committed for s in parts}
        new = {s.partition: s.read_next for s in parts}
        began = time.monotonic()
        await asyncio.to_thread(self._commit_sync, data, start, new)
        self.last_commit_seconds = round(time.monotonic() - began, 3)
        for s in parts:
            s.committed = s.read_next
            s.tables, s.dead, s.records, s.bytes = [], [], 0, 0
        self.commits += 1
        self.rows += 0 if data is None else data.num_rows
        self.last_commit = time.time()
        self.last_error = None
        self._next_commit = time.monotonic() + self.config.commit_interval_s

    def _commit_sync(
        self, data: pa.Table | None, start: dict[int, int], new: dict[int, int]
    ) -> None:
        cfg = self.config
        upsert = Upsert(cfg.id_columns, cfg.cdc_field) if cfg.upsert else None
        commit_offsets(
            self.catalog, cfg.identifier, self.topic, data, start, new,
            on_retry=self._commit_conflict, layout=cfg.layout, upsert=upsert,
        )

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
                    "log_end_offset": end,
                    "committed_offset": s.committed,
                    "lag_records": end - s.committed,
                    "lag_seconds": round(now - acked, 3) if acked is not None else 0.0,
                    "pending_records": s.records,
                    "dead_letters_pending": len(s.dead),
                    "stopped": s.stopped,
                }
            )
        return {
            "topic": self.topic,
            "table": f"{cfg.namespace}.{cfg.table}",
            "value_type": cfg.value_type,
            "commits": self.commits,
            "rows": self.rows,
            "dead_letters": self.dlq.count if self.dlq else 0,
            "dlq_topic": cfg.dlq_topic,
            "last_commit": self.last_commit,
            "last_error": self.last_error,
            "paused": self.paused,
            "retries": dict(self.retries),
            "partitions": parts,
        }
