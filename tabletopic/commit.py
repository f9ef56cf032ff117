"""One exactly-once commit of a table topic: rows (and dead-lettered offsets) of the offset
range [start, new) of some partitions, guarded so that it lands only on the table state it was
built from.

The table holds its position in the topic in the table property `floe.offsets` ({partition:
next offset}); every floe commit also writes it into its snapshot's summary. The guarantee:

    Every floe commit, with data or without (all its records went to the dead-letter topic),
    adds a snapshot and makes it the current one, and sets `floe.offsets`, in one catalog
    commit. Each is sent with explicit requirements: the table UUID, the current snapshot id
    (`main`) and the current schema id of the metadata it read `floe.offsets` from (plus the
    last column id when it evolves the schema). The catalog applies a commit only if the
    requirements hold on the table's current metadata, by compare-and-swap on the metadata
    location (SQL catalog) or atomically (REST catalog).

    So if a floe commit C lands, no floe commit landed between C's read and C's commit: any
    such commit would have changed the current snapshot id (ids are random 64-bit numbers,
    never reused in practice), and only floe commits change `floe.offsets`. Hence
    `floe.offsets` at C's commit is the value C read and checked (every
    partition C writes is at C's start offset), and C's rows are exactly the offsets between
    the old and the new `floe.offsets`: no offset is written twice or skipped.
    All-DLQ commits need the snapshot for this: a commit of properties alone leaves the
    snapshot id unchanged, so two of them (or one and a data commit built on the same
    snapshot) would both pass the check and the later would silently rewind or skip offsets.

    Other writers' commits (a Spark rewrite or expiry: new snapshot, same properties) make
    ours fail the snapshot requirement; we reload, check the offsets again (unchanged) and
    rebuild on the new snapshot, up to `attempts` times (COMMIT_RETRY: with a short backoff).
    A floe commit by someone else makes the re-check fail: StaleOffsets, the writer
    restarts from the table's offsets.
    Outside the model: a rollback of `main` to an older snapshot id by other tools (which
    leaves `floe.offsets` pointing past the rows rolled back; `floe table rollback` sets both
    in one guarded commit with the writer held, tabletopic.ops) and hand edits of
    `floe.offsets`.

What this rests on in pyiceberg (pinned in pyproject.toml, checked by tests/unit/
test_table_commit.py): `Transaction` stages updates for an append / empty fast append, a schema
union and properties, readable as `Transaction._updates`; `Catalog.commit_table(table,
requirements, updates)` applies them under the requirements given. We check the staged updates
before sending them (`check_updates`) and never call `Transaction.commit_transaction`, whose
retries (0.12 refreshes the table and rebuilds the snapshot on the new one after a conflict)
would drop our snapshot requirement. pyiceberg's own post-commit clean-up of old metadata files
(`write.metadata.delete-after-commit.enabled`) is therefore not run for floe commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AddSortOrderUpdate,
    AssertCurrentSchemaId,
    AssertDefaultSortOrderId,
    AssertDefaultSpecId,
    AssertLastAssignedFieldId,
    AssertLastAssignedPartitionId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

from s3stream.retry import RetryPolicy
from tabletopic.contract import MAIN, OFFSETS, encode_offsets, snapshot_summary, table_offsets
from tabletopic.partitioning import Layout, stage_layout
from tabletopic.rowsort import sort_rows
from tabletopic.upsert import Upsert, stage_upsert

log = logging.getLogger(__name__)


class StaleOffsets(Exception):
    """The table moved (another writer committed): start again from the table's offsets."""


class UnexpectedUpdates(RuntimeError):
    """pyiceberg staged something other than what a floe commit consists of (a pyiceberg
    version this code was not made for): nothing was committed."""


@dataclass(frozen=True)
class Prepared:
    """A commit built on one loaded table: what to send, and under which requirements."""

    table: Table
    updates: tuple[TableUpdate, ...]
    requirements: tuple[TableRequirement, ...]
    snapshot_id: int  # the snapshot this commit adds
    offsets: dict[int, int]  # floe.offsets after it
    # the data files were written for this commit alone (prepare), not handed in by workers
    # (prepare_files: another coordinator may commit those very files; never deleted here)
    owns_data_files: bool = True


def prepare(
    table: Table,
    topic: str,
    data: pa.Table | None,
    start: dict[int, int],
    new: dict[int, int],
    layout: Layout | None = None,
    upsert: Upsert | None = None,
) -> Prepared | None:
    """Build the commit of offsets [start, new) (rows `data`, None: every record of the range
    went to the dead-letter topic) on `table` as loaded, in `layout` (tabletopic.partitioning;
    staged with the rows when the table's differs) and, with `upsert`, replacing the keys the
    rows touch (tabletopic.upsert: an overwrite instead of the append). None: the table
    already holds exactly these offsets (an earlier attempt landed though its answer was
    lost). Raises StaleOffsets when the table is not at `start` for some partition (a
    partition the table does not know yet may start anywhere). Writes the data files; sends
    nothing to the catalog."""
    checked = offsets_after(table, start, new)
    if checked is None:
        return None
    offsets, encoded = checked
    meta = table.metadata
    summary = snapshot_summary(topic, encoded)
    tx = table.transaction()
    evolve = data is not None and not covers(table, data.schema)
    if data is not None and evolve:
        with tx.update_schema() as update:
            update.union_by_name(data.schema)
    relayout = layout is not None and stage_layout(tx, layout)
    if data is not None:
        order = layout.sort_by if layout is not None else ()
        if upsert is not None:
            stage_upsert(tx, data, upsert, summary, lambda rows: sort_rows(rows, order))
        else:
            tx.append(sort_rows(data, order), snapshot_properties=summary)
    else:
        with tx.update_snapshot(snapshot_properties=summary).fast_append():
            pass  # a snapshot without files: it carries the offsets (see the module docstring)
    tx.set_properties({OFFSETS: encoded})
    updates: tuple[TableUpdate, ...] = tx._updates
    snapshot_id = check_updates(updates, meta.current_snapshot_id, encoded, evolve, relayout)
    requirements: list[TableRequirement] = [
        AssertTableUUID(uuid=meta.table_uuid),
        AssertRefSnapshotId.model_validate({"ref": MAIN, "snapshot-id": meta.current_snapshot_id}),
        AssertCurrentSchemaId.model_validate({"current-schema-id": meta.current_schema_id}),
    ]
    if evolve:
        requirements.append(
            AssertLastAssignedFieldId.model_validate(
                {"last-assigned-field-id": meta.last_column_id}
            )
        )
    if relayout:
        requirements += [
            AssertDefaultSpecId.model_validate({"default-spec-id": meta.default_spec_id}),
            AssertLastAssignedPartitionId.model_validate(
                {"last-assigned-partition-id": meta.last_partition_id}),
            AssertDefaultSortOrderId.model_validate(
                {"default-sort-order-id": meta.default_sort_order_id}),
        ]
    return Prepared(table, updates, tuple(requirements), snapshot_id, offsets)


def offsets_after(
    table: Table, start: dict[int, int], new: dict[int, int]
) -> tuple[dict[int, int], str] | None:
    """The table's offsets after a commit of [start, new) on it as loaded, and their
    encoding; None when it holds exactly `new` already; StaleOffsets when it is not at
    `start` for some partition (a partition it does not know yet may start anywhere)."""
    current = table_offsets(table)
    if all(current.get(p) == o for p, o in new.items()):
        return None
    for p, o in start.items():
        if current.get(p, o) != o:
            raise StaleOffsets(f"partition {p}: table at {current.get(p)}, expected {o}")
    offsets = {**current, **new}
    return offsets, encode_offsets(offsets)


def check_updates(
    updates: tuple[TableUpdate, ...], parent: int | None, offsets: str, evolve: bool,
    relayout: bool = False,
) -> int:
    """The staged updates must be exactly: one new snapshot (child of `parent`, `floe.offsets`
    in its summary; an upsert's is an overwrite) made current on `main`, `floe.offsets` set,
    and a schema change, a partition spec or sort order change only if we asked for one.
    Returns the new snapshot's id; raises UnexpectedUpdates otherwise."""
    snaps = [u for u in updates if isinstance(u, AddSnapshotUpdate)]
    refs = [u for u in updates if isinstance(u, SetSnapshotRefUpdate)]
    props = [u for u in updates if isinstance(u, SetPropertiesUpdate)]
    schema = [u for u in updates if isinstance(u, AddSchemaUpdate | SetCurrentSchemaUpdate)]
    layout = [u for u in updates if isinstance(u, AddPartitionSpecUpdate | SetDefaultSpecUpdate
                                               | AddSortOrderUpdate | SetDefaultSortOrderUpdate)]
    problems = []
    if len(snaps) != 1 or snaps[0].snapshot.parent_snapshot_id != parent:
        problems.append("not one new snapshot on the current one")
    elif (summary := snaps[0].snapshot.summary) is None or summary[OFFSETS] != offsets:
        problems.append("snapshot summary without the offsets")
    new_id = snaps[0].snapshot.snapshot_id if snaps else None
    if len(refs) != 1 or refs[0].ref_name != MAIN or refs[0].snapshot_id != new_id:
        problems.append("the new snapshot is not made current on main")
    if len(props) != 1 or props[0].updates != {OFFSETS: offsets}:
        problems.append("floe.offsets not set")
    if bool(schema) != evolve:
        problems.append("unexpected schema change" if schema else "schema change missing")
    if bool(layout) != relayout:
        problems.append("unexpected layout change" if layout else "layout change missing")
    if len(snaps) + len(refs) + len(props) + len(schema) + len(layout) != len(updates):
        problems.append("other updates: " + ", ".join(sorted({type(u).__name__ for u in updates})))
    if problems or new_id is None:
        raise UnexpectedUpdates("; ".join(problems))
    return new_id


def send(catalog: Catalog, prepared: Prepared) -> None:
    """Send one prepared commit to the catalog. CommitFailedException: a requirement did not
    hold (the table moved): the commit did not land, and its files are deleted."""
    try:
        catalog.commit_table(prepared.table, prepared.requirements, prepared.updates)
    except CommitFailedException:
        discard_files(prepared)
        raise


def discard_files(prepared: Prepared) -> None:
    """Delete the files written for a commit that certainly did not land: its new manifests,
    its manifest list and, when it wrote them itself (`owns_data_files`), its data files
    (best effort; the orphan sweep gets what is left)."""
    io = prepared.table.io
    (snap,) = [u.snapshot for u in prepared.updates if isinstance(u, AddSnapshotUpdate)]
    paths = [snap.manifest_list]
    try:
        for m in snap.manifests(io):
            if m.added_snapshot_id != prepared.snapshot_id:
                continue
            paths.append(m.manifest_path)
            for e in m.fetch_manifest_entry(io, discard_deleted=False):
                if prepared.owns_data_files and e.status == ManifestEntryStatus.ADDED \
                        and e.snapshot_id == prepared.snapshot_id:
                    paths.append(e.data_file.file_path)
        for path in paths:
            io.delete(path)
    except Exception as e:
        log.warning("could not delete the files of a failed commit: %r", e)


def _is_conflict(e: BaseException) -> bool:
    return isinstance(e, CommitFailedException)


# Lost races against non-floe commits (a Spark rewrite or expiry): reload and rebuild, after a
# short jittered wait so that two committers do not collide again at once (Iceberg's own
# commit retries back off too). A race lost to a floe commit is StaleOffsets: not retried.
COMMIT_ATTEMPTS = 10
COMMIT_RETRY = RetryPolicy(
    max_attempts=COMMIT_ATTEMPTS, base_delay=0.05, max_delay=1.0, deadline=None, jitter=0.5,
    retriable=_is_conflict, log_level=logging.INFO,
)


def commit_offsets(
    catalog: Catalog,
    identifier: tuple[str, str],
    topic: str,
    data: pa.Table | None,
    start: dict[int, int],
    new: dict[int, int],
    attempts: int = COMMIT_ATTEMPTS,
    on_retry: Callable[[BaseException], None] | None = None,
    layout: Layout | None = None,
    upsert: Upsert | None = None,
) -> None:
    """Commit offsets [start, new) exactly once (see the module docstring): on a conflict the
    table is reloaded, the offsets checked again and the commit rebuilt, at most `attempts`
    times (COMMIT_RETRY; `on_retry` is told of each conflict). Raises StaleOffsets, or the
    last CommitFailedException when every attempt lost a race."""

    def attempt() -> None:
        prepared = prepare(
            catalog.load_table(identifier), topic, data, start, new, layout, upsert
        )
        if prepared is not None:
            send(catalog, prepared)

    policy = replace(COMMIT_RETRY, max_attempts=attempts)
    policy.run(attempt, f"table topic {topic}: commit", on_retry=on_retry, logger=log)


def covers(table: Table, schema: pa.Schema) -> bool:
    """Does the table's schema already hold every column (and nested field) of `schema`?"""
    from tabletopic.convert import plain

    have = {f.name: plain(f.type) for f in table.schema().as_arrow()}
    for f in schema:
        if f.name not in have:
            return False
        if plain(f.type) != have[f.name] and f.name != "_kafka":
            return False
    return True
