"""The metadata schema's version and numbered migrations (s3stream.metadata.migrations), on
SQLite and PostgreSQL: a new database records version 1; a database made before versions were
recorded (today's v1 tables, no `schema_version`) is recorded as version 1 with its data
untouched; pending migrations apply once each, in their own transaction (a failing one leaves
the last complete version); a version newer than the code is refused and nothing is written;
brokers opening one database together apply a migration once; the Schema Registry's tables
use the same runner, and its pre-runner version in `meta` is carried over. Migration 3 hands
the Kafka tables over to broker.metadata, whose migration 1 moves their rows into its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.metadata import KafkaMetadata
from broker.schemaregistry.store import COMPONENT as REGISTRY
from broker.schemaregistry.store import RegistryStore
from s3stream.metadata import MetadataStore, SchemaTooNewError, open_metadata_store
from s3stream.metadata.backend import Connection, Dialect
from s3stream.metadata.migrations import Component, sql_migration

# A database with today's (v1) tables and rows, as a store made before versioning left it.
V1_ROWS = [
    "INSERT INTO meta(key, value) VALUES ('cluster_id', 'oldcluster'), ('next_object_id', '7')",
    "INSERT INTO topics VALUES ('t', '00000000-0000-0000-0000-000000000001', '{\"a\": \"b\"}', 5)",
    "INSERT INTO streams(topic, partition, start_offset, end_offset) VALUES ('t', 0, 0, 3)",
    "INSERT INTO objects VALUES (6, 'wal/6', 100, 'wal', 5)",
    "INSERT INTO chunks VALUES (1, 0, 2, 6, 0, 100, 9)",
    "INSERT INTO producer_batches VALUES (1, 1000, 0, 0, 2, 0, 2)",
    "INSERT INTO group_offsets VALUES ('g', 't', 0, 2, -1, NULL, 5)",
]
TABLES = ["meta", "topics", "streams", "objects", "chunks", "producer_batches", "group_offsets"]
STORE_VERSIONS = [("s3stream.metadata", 1), ("s3stream.metadata", 2), ("s3stream.metadata", 3)]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return str(request.getfixturevalue("pg_url"))


async def in_store(url: str, fn: Callable[[Connection, Dialect], Any]) -> Any:
    """fn(db, dialect) in one write transaction of a store that is connected but not opened
    (no migration runs): to set up or inspect a database as it is on disk."""
    s = open_metadata_store(url)
    s._opened = True

    def call() -> Any:
        with s._txn() as db:
            return fn(db, s.backend.dialect)
    try:
        return await s._run(call)
    finally:
        await s.close()


def make_v1(db: Connection, dialect: Dialect) -> None:
    for statement in dialect.schema():  # today's CREATE TABLE statements (migration 1)
        db.execute(statement)
    for statement in V1_ROWS:
        db.execute(statement)


def dump(db: Connection, dialect: Dialect) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(tuple(r) for r in db.execute(f"SELECT * FROM {t}")) for t in TABLES}


def versions(db: Connection, dialect: Dialect) -> list[tuple[str, int, int]]:
    return sorted((str(c), int(v), int(a)) for c, v, a in db.execute(
        "SELECT component, version, applied_at FROM schema_version"))


async def open_close(url: str, *components: Component) -> MetadataStore:
    s = open_metadata_store(url)
    await s.open()
    try:
        for c in components:
            await s.migrate(c)
    finally:
        await s.close()
    return s


def has_index(db: Connection, dialect: Dialect, name: str) -> bool:
    sql = ("SELECT to_regclass(?::text)" if dialect.for_update
           else "SELECT max(name) FROM sqlite_master WHERE type='index' AND name=?")
    return db.execute(sql, (name,)).fetchone()[0] is not None


async def test_a_new_database_is_at_the_latest_version_and_a_second_open_is_a_no_op(
    url: str,
) -> None:
    await open_close(url)
    rows = await in_store(url, versions)
    assert [(c, v) for c, v, _ in rows] == STORE_VERSIONS
    assert all(a > 0 for _, _, a in rows)  # applied by this code
    before = await in_store(url, dump)
    await open_close(url)
    assert await in_store(url, versions) == rows
    assert await in_store(url, dump) == before


def kafka_dump(db: Connection, dialect: Dialect) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(tuple(r) for r in db.execute(f"SELECT * FROM {t}")) for t in [
        "meta", "streams", "objects", "chunks", "kafka_topics", "kafka_partitions",
        "kafka_producer_batches", "kafka_group_offsets", "kafka_meta"]}


async def test_a_database_from_before_versions_is_recorded_as_version_1_and_migrated(
    url: str,
) -> None:
    """s3stream alone first (migrations 2 and 3: the Kafka tables are left for their owner,
    the partitions handed over), then the broker's component moves every row into its own
    tables and drops the old ones."""
    await in_store(url, make_v1)
    s = open_metadata_store(url)
    await s.open()
    try:
        assert await s.cluster_id() == "oldcluster"
        streams, chunks = await s.load()
        assert [(x.stream_id, x.end_offset, len(chunks)) for x in streams] == [(1, 3, 1)]
        assert await s.reserve_object_ids(1) == 7
    finally:
        await s.close()
    assert await in_store(url, lambda db, d: db.execute(
        "SELECT * FROM legacy_stream_partitions").fetchall()) == [(1, "t", 0)]
    assert await in_store(url, lambda db, d: db.execute(
        "SELECT count(*) FROM producer_batches").fetchone()[0]) == 1  # untouched so far
    k = KafkaMetadata(open_metadata_store(url))
    await k.open()
    try:
        state = await k.load()
        assert [(t.name, str(t.topic_id), t.configs) for t in state.topics] == [
            ("t", "00000000-0000-0000-0000-000000000001", {"a": "b"})]
        assert [(p.topic, p.partition, p.stream_id) for p in state.partitions] == [("t", 0, 1)]
        assert [(r.stream_id, r.producer_id, r.last_seq) for r in state.producers] == [
            (1, 1000, 2)]
        assert [(r.group_id, r.topic, r.committed_offset) for r in await k.load_offsets()] == [
            ("g", "t", 2)]
        assert await k.next_producer_id() == 1000
    finally:
        await k.close()
    after = await in_store(url, kafka_dump)
    assert after["meta"] == [("cluster_id", "oldcluster"), ("next_object_id", "8")]
    assert after["kafka_meta"] == [("controller", ""), ("next_producer_id", "1001")]
    assert after["streams"] == [(1, 0, 3, 0, 0)]  # stream_id, start, end, epoch, deleted
    for gone in ["topics", "producer_batches", "group_offsets", "legacy_stream_partitions"]:
        assert not await in_store(url, lambda db, d, t=gone: db.execute(
            d.table_exists, (t,)).fetchone()[0]), gone
    # 1 found in place (applied_at 0, not applied by this code), then migrations 2 and 3
    rows = await in_store(url, versions)
    assert [r[:2] for r in rows] == [("broker.metadata", 1), ("broker.metadata", 2),
                                     ("broker.metadata", 3), ("broker.metadata", 4),
                                     ("broker.metadata", 5), ("broker.metadata", 6),
                                     *STORE_VERSIONS]
    assert [r[2] > 0 for r in rows] == [True, True, True, True, True, True, False, True, True]
    assert await in_store(url, lambda db, d: has_index(db, d, "chunks_object"))
    # a second open changes nothing
    k = KafkaMetadata(open_metadata_store(url))
    await k.open()
    await k.close()
    assert await in_store(url, kafka_dump) == after and await in_store(url, versions) == rows


async def test_pending_migrations_apply_once_each_and_a_failing_one_keeps_the_last_version(
    url: str,
) -> None:
    await open_close(url)
    ok = Component("test.part", [
        sql_migration("CREATE TABLE part_a(x {int} PRIMARY KEY)"),
        sql_migration("ALTER TABLE part_a ADD COLUMN y TEXT; INSERT INTO part_a VALUES (1, 'v2')"),
    ])
    await open_close(url, ok)
    await open_close(url, ok)  # nothing pending: the INSERT of migration 2 does not run again
    assert await in_store(url, lambda db, d: db.execute("SELECT * FROM part_a").fetchall()) == [
        (1, "v2")]

    def fails(db: Connection, dialect: Dialect) -> None:
        db.execute("CREATE TABLE part_b(x TEXT)")
        raise RuntimeError("migration 3 is broken")

    with pytest.raises(RuntimeError, match="migration 3 is broken"):
        await open_close(url, Component("test.part", [*ok.migrations, fails]))
    rows = await in_store(url, versions)
    assert [(c, v) for c, v, _ in rows] == [*STORE_VERSIONS, ("test.part", 1), ("test.part", 2)]
    assert not await in_store(url, lambda db, d: db.execute(d.table_exists, ("part_b",))
                              .fetchone()[0])


async def test_a_database_newer_than_the_code_is_refused_and_not_written(url: str) -> None:
    await in_store(url, make_v1)
    await in_store(url, lambda db, d: [db.execute(
        "CREATE TABLE schema_version(component TEXT NOT NULL, version BIGINT NOT NULL,"
        " applied_at BIGINT NOT NULL, PRIMARY KEY(component, version))"),
        db.execute("INSERT INTO schema_version VALUES ('s3stream.metadata', 1, 0),"
                   " ('s3stream.metadata', 4, 1)"),
        db.execute("DELETE FROM meta WHERE key='cluster_id'")])
    before = await in_store(url, dump)
    s = open_metadata_store(url)
    with pytest.raises(SchemaTooNewError, match=r"schema version 4, this floe knows versions up"
                       r" to 3.*newer floe; refusing to open it"):
        await s.open()
    await s.close()
    assert await in_store(url, dump) == before  # not even a cluster id was added
    assert await in_store(url, versions) == [("s3stream.metadata", 1, 0),
                                             ("s3stream.metadata", 4, 1)]
    # the same for another component's tables
    await in_store(url, lambda db, d: db.execute("DELETE FROM schema_version WHERE version=4"))
    await open_close(url)
    await in_store(url, lambda db, d: db.execute(
        "INSERT INTO schema_version VALUES ('schema_registry', 5, 1)"))
    with pytest.raises(SchemaTooNewError, match="'schema_registry' is at schema version 5"):
        await open_close(url, REGISTRY)
    assert not await in_store(url, lambda db, d: db.execute(d.table_exists, ("sr_schemas",))
                              .fetchone()[0])


async def test_stores_opening_together_apply_a_migration_once(url: str) -> None:
    def counted(db: Connection, dialect: Dialect) -> None:
        # not idempotent: a second run would fail (primary key) or add a row
        db.execute(f"CREATE TABLE IF NOT EXISTS runs(n {dialect.int_type} PRIMARY KEY)")
        db.execute("INSERT INTO runs SELECT count(*) + 1 FROM runs")

    part = Component("test.once", [counted])
    await asyncio.gather(*(open_close(url, part) for _ in range(4)))
    assert await in_store(url, lambda db, d: db.execute("SELECT n FROM runs").fetchall()) == [
        (1,)]
    rows = await in_store(url, versions)
    assert [(c, v) for c, v, _ in rows] == [*STORE_VERSIONS, ("test.once", 1)]


async def test_the_registry_uses_the_runner_and_keeps_its_pre_runner_version(url: str) -> None:
    await open_close(url)
    # a registry migrated by the code before the shared runner: its tables + version in meta
    def old_registry(db: Connection, dialect: Dialect) -> None:
        REGISTRY.migrations[0](db, dialect)
        db.execute("INSERT INTO meta(key, value) VALUES ('schema_registry.migration', '1')")
        db.execute("INSERT INTO sr_config VALUES ('', 'FULL')")
    await in_store(url, old_registry)
    s = open_metadata_store(url)
    await s.open()
    try:
        assert await RegistryStore(s).migrate() == 1
    finally:
        await s.close()
    rows = await in_store(url, versions)
    assert ("schema_registry", 1, 0) in rows  # recorded as found, not re-applied
    assert await in_store(url, lambda db, d: db.execute("SELECT * FROM sr_config").fetchall()
                          ) == [("", "FULL")]



async def test_migration_2_indexes_chunks_by_object_for_the_object_gc(tmp_path: Path) -> None:
    """The GC's and compaction's lookups of chunks by object use the index (SQLite's plan)."""
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    await open_close(url)
    plans = await in_store(url, lambda db, d: [
        " ".join(str(r[-1]) for r in db.execute("EXPLAIN QUERY PLAN " + q).fetchall())
        for q in ("SELECT object_id FROM objects o WHERE created_ms < 1 AND NOT EXISTS"
                  " (SELECT 1 FROM chunks c WHERE c.object_id = o.object_id)",
                  "SELECT stream_id FROM chunks WHERE object_id IN (1, 2)")])
    assert all("chunks_object" in plan for plan in plans), plans
