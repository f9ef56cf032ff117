"""Maintenance jobs on the broker's Iceberg tables, run through Iceberg's Spark procedures.

Every job is safe while the broker keeps committing to the table:
  - rewrite_data_files / rewrite_manifests commit with Iceberg's optimistic concurrency (a
    broker append in between makes Spark retry on the new base; the broker's own commits
    retry the same way);
  - the broker's position lives in the table property `floe.offsets` (JSON {partition: next
    offset}), which every Spark commit carries over unchanged, so expiring old snapshots
    (whose summaries also hold offsets) loses nothing the broker needs; the current snapshot
    and the last `retain_last` ones are always kept;
  - remove_orphan_files only deletes files older than a safety age (at least a day: Iceberg's
    procedure refuses less), so a data file the broker wrote but has not committed yet is never
    taken for an orphan.
Each job returns a small dict of what it did. Table names: spark_compaction.names; reading
tables and their stats: spark_compaction.tables.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from s3stream.retry import RetryPolicy
from spark_compaction.errors import error_text
from spark_compaction.names import TableRef, sql_string, table_ref, timestamp_literal
from spark_compaction.tables import (
    data_file_stats,
    manifest_count,
    snapshot_stats,
    table_properties,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SORT_PROPERTY = "floe.compaction.sort-columns"  # comma-separated sort columns, optional
MIN_ORPHAN_AGE = dt.timedelta(days=1)  # Iceberg's procedure refuses anything shorter
MAX_LISTED_ORPHANS = 50


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


COMMIT_ATTEMPTS = 5  # procedure calls lost to the broker's commits, beyond Iceberg's own retries


def is_commit_conflict(e: BaseException) -> bool:
    """Did a commit lose against a concurrent one (the broker's, every few seconds)?"""
    text = error_text(e)
    return "CommitFailedException" in text or "Cannot commit rewrite" in text


# 0.5 s doubling to 5 s, each wait in [d/2, d]
COMMIT_RETRY = RetryPolicy(
    max_attempts=COMMIT_ATTEMPTS, base_delay=0.5, max_delay=5.0, deadline=None, jitter=0.5,
    retriable=is_commit_conflict, log_level=logging.INFO,
)


def _call(
    spark: SparkSession, query: str, policy: RetryPolicy = COMMIT_RETRY
) -> tuple[list[dict[str, Any]], int]:
    """Run a procedure; when its commit loses to concurrent commits even after Iceberg's own
    retries (a table committed to many times a second), run it again. (rows, attempts used)"""
    attempts = 0

    def once() -> list[dict[str, Any]]:
        nonlocal attempts
        attempts += 1
        return [r.asDict() for r in spark.sql(query).collect()]

    rows = policy.run(once, f"Spark procedure {query.split('(', 1)[0]}", logger=log)
    return rows, attempts


def _options(options: Mapping[str, str]) -> str:
    args = ", ".join(f"{sql_string(k)}, {sql_string(str(v))}" for k, v in options.items())
    return f"map({args})"


# --------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------
def rewrite_data_files(
    spark: SparkSession,
    table: str | TableRef,
    *,
    catalog: str = "floe",
    sort_columns: Sequence[str] | None = None,
    target_file_size_bytes: int | None = None,
    min_input_files: int = 2,
    where: str | None = None,
    options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Merge small data files (bin-pack), or rewrite them sorted by `sort_columns`
    (default: the table property floe.compaction.sort-columns, comma-separated, if set).
    Sort columns are Spark sort expressions: `_kafka.partition`, `ts DESC NULLS LAST`..."""
    ref = table_ref(table, catalog)
    started = time.monotonic()
    if sort_columns is None:
        configured = table_properties(spark, ref).get(SORT_PROPERTY, "")
        sort_columns = [c.strip() for c in configured.split(",") if c.strip()]
    opts: dict[str, str] = {"min-input-files": str(min_input_files)}
    if target_file_size_bytes is not None:
        opts["target-file-size-bytes"] = str(target_file_size_bytes)
    opts.update(options or {})
    before = data_file_stats(spark, ref)
    args = [f"table => {ref.arg}", f"options => {_options(opts)}"]
    if sort_columns:
        args.append("strategy => 'sort'")
        args.append(f"sort_order => {sql_string(', '.join(sort_columns))}")
    if where:
        args.append(f"where => {sql_string(where)}")
    rows, attempts = _call(spark, f"CALL {ref.procedures}.rewrite_data_files({', '.join(args)})")
    row = rows[0] if rows else {}
    after = data_file_stats(spark, ref)
    return {
        "job": "rewrite_data_files",
        "table": str(ref),
        "strategy": "sort" if sort_columns else "binpack",
        "sort_columns": list(sort_columns),
        "data_files_before": before["files"],
        "data_files_after": after["files"],
        "bytes_before": before["bytes"],
        "bytes_after": after["bytes"],
        "rewritten_data_files": int(row.get("rewritten_data_files_count", 0)),
        "added_data_files": int(row.get("added_data_files_count", 0)),
        "rewritten_bytes": int(row.get("rewritten_bytes_count", 0)),
        "failed_data_files": int(row.get("failed_data_files_count", 0)),
        "attempts": attempts,
        "seconds": round(time.monotonic() - started, 3),
    }


def rewrite_manifests(
    spark: SparkSession, table: str | TableRef, *, catalog: str = "floe"
) -> dict[str, Any]:
    """Regroup the manifests (one per broker commit) into a few large ones."""
    ref = table_ref(table, catalog)
    started = time.monotonic()
    before = manifest_count(spark, ref)
    rows, attempts = _call(spark, f"CALL {ref.procedures}.rewrite_manifests(table => {ref.arg})")
    row = rows[0] if rows else {}
    return {
        "job": "rewrite_manifests",
        "table": str(ref),
        "manifests_before": before,
        "manifests_after": manifest_count(spark, ref),
        "rewritten_manifests": int(row.get("rewritten_manifests_count", 0)),
        "added_manifests": int(row.get("added_manifests_count", 0)),
        "attempts": attempts,
        "seconds": round(time.monotonic() - started, 3),
    }


def expire_snapshots(
    spark: SparkSession,
    table: str | TableRef,
    *,
    catalog: str = "floe",
    max_age: dt.timedelta = dt.timedelta(hours=1),
    retain_last: int = 20,
    now: float | None = None,
) -> dict[str, Any]:
    """Expire snapshots older than `max_age`, keeping at least the last `retain_last` (the
    current snapshot is never expired), and delete the files only they referenced."""
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    if max_age < dt.timedelta(0):
        raise ValueError("max_age must not be negative")
    ref = table_ref(table, catalog)
    started = time.monotonic()
    cutoff = (time.time() if now is None else now) - max_age.total_seconds()
    before = snapshot_stats(spark, ref)["snapshots"]
    rows, attempts = _call(
        spark,
        f"CALL {ref.procedures}.expire_snapshots(table => {ref.arg}, "
        f"older_than => {timestamp_literal(cutoff)}, retain_last => {int(retain_last)})",
    )
    row = rows[0] if rows else {}
    after = snapshot_stats(spark, ref)["snapshots"]
    return {
        "job": "expire_snapshots",
        "table": str(ref),
        "snapshots_before": before,
        "snapshots_after": after,
        "snapshots_expired": before - after,
        "deleted_data_files": int(row.get("deleted_data_files_count", 0)),
        "deleted_delete_files": int(row.get("deleted_position_delete_files_count", 0))
        + int(row.get("deleted_equality_delete_files_count", 0)),
        "deleted_manifests": int(row.get("deleted_manifest_files_count", 0)),
        "deleted_manifest_lists": int(row.get("deleted_manifest_lists_count", 0)),
        "attempts": attempts,
        "seconds": round(time.monotonic() - started, 3),
    }


def remove_orphan_files(
    spark: SparkSession,
    table: str | TableRef,
    *,
    catalog: str = "floe",
    min_age: dt.timedelta = MIN_ORPHAN_AGE,
    dry_run: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """Delete files under the table's location that no snapshot or metadata references and
    that are older than `min_age` (at least a day: younger files may be a commit in flight,
    the broker's or anyone's)."""
    if min_age < MIN_ORPHAN_AGE:
        raise ValueError(
            f"min_age {min_age} is below {MIN_ORPHAN_AGE}: a younger file may belong to a "
            "commit in progress (Iceberg's procedure refuses it too)"
        )
    ref = table_ref(table, catalog)
    started = time.monotonic()
    cutoff = (time.time() if now is None else now) - min_age.total_seconds()
    rows = spark.sql(
        f"CALL {ref.procedures}.remove_orphan_files(table => {ref.arg}, "
        f"older_than => {timestamp_literal(cutoff)}, dry_run => {str(dry_run).lower()})"
    ).collect()
    files = sorted(str(r["orphan_file_location"]) for r in rows)
    return {
        "job": "remove_orphan_files",
        "table": str(ref),
        "dry_run": dry_run,
        "older_than": dt.datetime.fromtimestamp(cutoff, dt.UTC).isoformat(),
        "orphans_found": len(files),
        "orphans_removed": 0 if dry_run else len(files),
        "orphan_files": files[:MAX_LISTED_ORPHANS],
        "seconds": round(time.monotonic() - started, 3),
    }


# --------------------------------------------------------------------------------------------
# Several jobs
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobOptions:
    sort_columns: Sequence[str] | None = None
    target_file_size_bytes: int | None = None
    min_input_files: int = 2
    max_snapshot_age: dt.timedelta = dt.timedelta(hours=1)
    retain_last: int = 20
    orphan_min_age: dt.timedelta = MIN_ORPHAN_AGE
    dry_run_orphans: bool = False


ALL_JOBS = ("rewrite_data_files", "rewrite_manifests", "expire_snapshots", "remove_orphan_files")


def run_jobs(
    spark: SparkSession,
    table: str | TableRef,
    jobs: Sequence[str] = ALL_JOBS,
    options: JobOptions | None = None,
    catalog: str = "floe",
) -> list[dict[str, Any]]:
    """Run `jobs` (names from ALL_JOBS, run in that order) on one table. A failing job is
    reported in its result ({"job", "table", "error"}) and the next ones still run."""
    unknown = set(jobs) - set(ALL_JOBS)
    if unknown:
        raise ValueError(f"unknown job(s) {sorted(unknown)}; known: {', '.join(ALL_JOBS)}")
    o = options or JobOptions()
    ref = table_ref(table, catalog)
    results: list[dict[str, Any]] = []
    for job in ALL_JOBS:
        if job not in jobs:
            continue
        try:
            if job == "rewrite_data_files":
                r = rewrite_data_files(
                    spark,
                    ref,
                    sort_columns=o.sort_columns,
                    target_file_size_bytes=o.target_file_size_bytes,
                    min_input_files=o.min_input_files,
                )
            elif job == "rewrite_manifests":
                r = rewrite_manifests(spark, ref)
            elif job == "expire_snapshots":
                r = expire_snapshots(
                    spark, ref, max_age=o.max_snapshot_age, retain_last=o.retain_last
                )
            else:
                r = remove_orphan_files(
                    spark, ref, min_age=o.orphan_min_age, dry_run=o.dry_run_orphans
                )
        except Exception as e:
            log.warning("%s on %s failed: %s", job, ref, error_text(e))
            r = {"job": job, "table": str(ref), "error": error_text(e)}
        results.append(r)
    return results
