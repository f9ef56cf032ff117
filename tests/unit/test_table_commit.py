"""Table-topic commits racing on one table (tabletopic.commit), on a local and an S3 warehouse
(a losing commit deletes the files it wrote, so both backends).

A topic model: partition 0 holds offsets 0..TOPIC_END-1; the offsets in DEAD do not convert and
go to the dead-letter topic, every other offset is a row. Writers commit offset ranges
[start, end) like the broker's TableWriter: rows of the valid offsets, or nothing at all when
every offset of the range is dead (an all-DLQ commit). A commit that lost (StaleOffsets)
resumes from the table's offsets, like the writer does.

What must survive every race: the table holds every valid offset exactly once, and its
`floe.offsets` never goes back (it ends at TOPIC_END). The races are made deterministic with a
catalog that runs the other writer's commit at the moment the first one calls commit_table,
i.e. after it read the table and wrote its files.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import SetPropertiesUpdate, TableRequirement, TableUpdate

from tabletopic.catalog import catalog_properties
from tabletopic.commit import (
    StaleOffsets,
    UnexpectedUpdates,
    check_updates,
    commit_offsets,
    prepare,
)
from tabletopic.contract import encode_offsets, table_offsets
from tabletopic.orphans import remove_orphan_files
from tests.warehouses import Warehouse

TOPIC_END = 20
DEAD = {7, 8, 9}
IDENT = ("ns", "t")
SCHEMA = pa.schema([pa.field("partition", pa.int32()), pa.field("offset", pa.int64())])


class HookedCatalog(SqlCatalog):
    """The real SQL catalog; `before_commit`, if set, runs once when the next commit_table is
    called, before the commit goes to the database (another writer's commit, say)."""

    before_commit: Callable[[], None] | None = None

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> Any:
        hook, self.before_commit = self.before_commit, None
        if hook is not None:
            hook()
        return super().commit_table(table, requirements, updates)


def hooked(wh: Warehouse) -> HookedCatalog:
    return HookedCatalog("floe", uri=wh.catalog_url, **catalog_properties(wh.url))


def rows(lo: int, hi: int) -> pa.Table | None:
    """The rows of offsets [lo, hi); None if every one of them is dead (all-DLQ commit)."""
    valid = [o for o in range(lo, hi) if o not in DEAD]
    if not valid:
        return None
    return pa.table({"partition": [0] * len(valid), "offset": valid}, schema=SCHEMA)


def commit(cat: Catalog, lo: int, hi: int) -> None:
    commit_offsets(cat, IDENT, "t", rows(lo, hi), {0: lo}, {0: hi})


def resume(cat: Catalog, end: int = TOPIC_END) -> None:
    """A writer restarting from the table's offsets and committing the rest of the topic."""
    lo = table_offsets(cat.load_table(IDENT)).get(0, 0)
    if lo < end:
        commit(cat, lo, end)


def assert_exactly_once(cat: Catalog) -> None:
    t = cat.load_table(IDENT)
    seen = Counter(t.scan().to_arrow().column("offset").to_pylist())
    assert max(seen.values()) == 1, (
        f"offsets in the table twice: {[o for o, n in seen.items() if n > 1]}"
    )
    assert set(seen) == set(range(TOPIC_END)) - DEAD
    assert table_offsets(t) == {0: TOPIC_END}


def race(wh: Warehouse, first: tuple[int, int], second: tuple[int, int], start: int = 0) -> bool:
    """Writer A commits `first`; while it is at the catalog, writer B commits `second`. Returns
    whether A's commit went through. Then both resume to the end of the topic."""
    plain = wh.catalog
    if start:
        commit(plain, 0, start)
    a = hooked(wh)
    a.before_commit = lambda: commit(plain, *second)
    try:
        commit(a, *first)
        landed = True
    except StaleOffsets:
        landed = False
    after = table_offsets(plain.load_table(IDENT))[0]
    assert after >= max(first[1] if landed else 0, second[1]), "floe.offsets went back"
    resume(a)
    resume(plain)
    return landed


@pytest.fixture
def wh(warehouse: Warehouse) -> Warehouse:
    warehouse.catalog.create_table(IDENT, schema=SCHEMA)
    return warehouse


def test_data_commit_against_data_commit(wh: Warehouse) -> None:
    assert not race(wh, first=(0, 5), second=(0, 3))
    assert_exactly_once(wh.catalog)


def test_all_dlq_commit_against_a_data_commit_that_went_further(wh: Warehouse) -> None:
    """A's range 7..9 is all dead letters (a commit with no rows); B commits rows up to 20 in
    the meantime. A must not set floe.offsets back to 10 (rows 10..19 would come twice)."""
    assert not race(wh, first=(7, 10), second=(7, TOPIC_END), start=7)
    assert_exactly_once(wh.catalog)


def test_data_commit_against_an_all_dlq_commit(wh: Warehouse) -> None:
    assert not race(wh, first=(7, TOPIC_END), second=(7, 10), start=7)
    assert_exactly_once(wh.catalog)


def test_all_dlq_commit_against_an_all_dlq_commit(wh: Warehouse) -> None:
    assert not race(wh, first=(7, 8), second=(7, 10), start=7)
    assert_exactly_once(wh.catalog)


def test_a_compaction_between_read_and_commit_neither_loses_nor_duplicates(
    wh: Warehouse,
) -> None:
    """A replace snapshot (what a Spark rewrite makes: same rows, new files, table properties
    untouched) lands while A is at the catalog: A reloads, finds its offsets unchanged, and
    commits on top of it, once."""
    commit(wh.catalog, 0, 5)

    def compact() -> None:
        t = wh.catalog.load_table(IDENT)
        t.overwrite(t.scan().to_arrow())

    a = hooked(wh)
    a.before_commit = compact
    commit(a, 5, TOPIC_END)
    t = wh.catalog.load_table(IDENT)
    ops = [(s.summary.operation.value, s.summary["floe.offsets"]) for s in t.snapshots()]
    assert ops == [
        ("append", '{"0": 5}'),
        ("delete", None),
        ("append", None),
        ("append", f'{{"0": {TOPIC_END}}}'),
    ]
    assert_exactly_once(wh.catalog)


def test_conflicts_with_other_commits_are_retried_up_to_the_limit(wh: Warehouse) -> None:
    """Every attempt loses to a compaction (a Spark rewrite each time): after `attempts`
    attempts the last CommitFailedException is raised, each retry reported to on_retry; with
    one compaction only, the commit lands on the second attempt."""
    commit(wh.catalog, 0, 5)
    compactions: list[int] = []

    def compact() -> None:
        compactions.append(1)
        t = wh.catalog.load_table(IDENT)
        t.overwrite(t.scan().to_arrow())

    a = hooked(wh)
    retried: list[BaseException] = []

    def rearm(e: BaseException) -> None:
        retried.append(e)
        a.before_commit = compact

    a.before_commit = compact
    with pytest.raises(CommitFailedException) as info:
        commit_offsets(a, IDENT, "t", rows(5, 10), {0: 5}, {0: 10}, attempts=3, on_retry=rearm)
    assert len(compactions) == 3 and len(retried) == 2
    assert "gave up after 3 attempts" in " ".join(info.value.__notes__)
    assert table_offsets(wh.catalog.load_table(IDENT)) == {0: 5}

    retried.clear()
    a.before_commit = compact
    commit_offsets(a, IDENT, "t", rows(5, TOPIC_END), {0: 5}, {0: TOPIC_END},
                   on_retry=retried.append)
    assert len(retried) == 1 and isinstance(retried[0], CommitFailedException)
    assert_exactly_once(wh.catalog)


def test_a_lost_commit_leaves_no_files_behind(wh: Warehouse) -> None:
    """The loser's data files are deleted (the commit certainly did not land), and a sweep of
    age 0 afterwards finds no orphans while every live file survives."""
    race(wh, first=(0, 5), second=(0, 3))
    t = wh.catalog.load_table(IDENT)
    assert remove_orphan_files(t, 0) == []
    assert_exactly_once(wh.catalog)


def test_two_writers_committing_concurrently(wh: Warehouse) -> None:
    """Two threads, each a writer following the topic in small steps and resuming from the
    table whenever it lost a race: the table equals the topic exactly once."""
    end = 60
    errors: list[BaseException] = []

    def writer(step: int) -> None:
        cat = hooked(wh)
        try:
            for _ in range(200):
                lo = table_offsets(cat.load_table(IDENT)).get(0, 0)
                if lo >= end:
                    return
                try:
                    commit_offsets(
                        cat,
                        IDENT,
                        "t",
                        rows(lo, min(end, lo + step)),
                        {0: lo},
                        {0: min(end, lo + step)},
                    )
                except (StaleOffsets, CommitFailedException):
                    continue
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(s,)) for s in (3, 4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors and not any(th.is_alive() for th in threads)
    t = wh.catalog.load_table(IDENT)
    seen = Counter(t.scan().to_arrow().column("offset").to_pylist())
    assert max(seen.values()) == 1
    assert set(seen) == set(range(end)) - DEAD
    assert table_offsets(t) == {0: end}


def test_staged_updates_are_checked_before_they_are_sent(wh: Warehouse) -> None:
    """What we take from pyiceberg's Transaction is checked: a commit whose staged updates are
    not exactly a snapshot on the current one, main moved to it and floe.offsets set is refused
    before anything reaches the catalog."""
    t = wh.catalog.load_table(IDENT)
    p = prepare(t, "t", rows(0, 5), {0: 0}, {0: 5})
    assert p is not None
    offsets = encode_offsets({0: 5})
    assert check_updates(p.updates, None, offsets, evolve=False) == p.snapshot_id
    with pytest.raises(UnexpectedUpdates):
        check_updates(p.updates, None, encode_offsets({0: 6}), evolve=False)
    with pytest.raises(UnexpectedUpdates):
        extra = SetPropertiesUpdate(updates={"x": "y"})
        check_updates((*p.updates, extra), None, offsets, evolve=False)
    without_props = tuple(u for u in p.updates if not isinstance(u, SetPropertiesUpdate))
    with pytest.raises(UnexpectedUpdates):
        check_updates(without_props, None, offsets, evolve=False)
    kinds = {type(r).__name__: r for r in p.requirements}
    assert set(kinds) == {"AssertTableUUID", "AssertRefSnapshotId", "AssertCurrentSchemaId"}
    assert table_offsets(wh.catalog.load_table(IDENT)) == {}  # nothing was committed


def test_pyiceberg_is_within_the_pinned_range() -> None:
    """tabletopic.commit reads Transaction._updates; the range in pyproject.toml is the one
    tested. A version outside it must be tested (and the pin moved) first."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (dep,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("pyiceberg")]
    spec = SpecifierSet(dep.split("]", 1)[1].split(";")[0].strip())
    assert spec.contains(Version(version("pyiceberg"))), (version("pyiceberg"), str(spec))
    assert spec.contains("0.12.0") and not spec.contains("0.13.0")


def test_a_commit_that_adds_columns_asserts_the_schema_it_evolved(wh: Warehouse) -> None:
    """Rows with a new column evolve the schema in the same commit, guarded by the schema id and
    the last column id read; the rows land once with the new column."""
    t = wh.catalog.load_table(IDENT)
    wide = pa.table(
        {"partition": pa.array([0, 0], pa.int32()), "offset": [0, 1], "extra": ["a", "b"]}
    )
    p = prepare(t, "t", wide, {0: 0}, {0: 2})
    assert p is not None
    kinds = {type(r).__name__ for r in p.requirements}
    assert kinds == {
        "AssertTableUUID",
        "AssertRefSnapshotId",
        "AssertCurrentSchemaId",
        "AssertLastAssignedFieldId",
    }
    commit_offsets(wh.catalog, IDENT, "t", wide, {0: 0}, {0: 2})
    got = wh.catalog.load_table(IDENT).scan().to_arrow()
    assert got.column("extra").to_pylist() == ["a", "b"]
    assert table_offsets(wh.catalog.load_table(IDENT)) == {0: 2}
