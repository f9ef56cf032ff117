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
Each job returns a small dict of what it did.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_compaction.policy import TableStats, Thresholds
from tabletopic.contract import is_table_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SORT_PROPERTY = "floe.compaction.sort-columns"  # comma-separated sort columns, optional
MIN_ORPHAN_AGE = dt.timedelta(days=1)  # Iceberg's procedure refuses anything shorter
MAX_LISTED_ORPHANS = 50


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------
def split_identifier(text: str) -> list[str]:
    """`a.b.c`, `` `a.b`.c `` -> parts (backticks quote, doubled backticks escape one)."""
    parts: list[str] = []
    cur: list[str] = []
    i, quoted, was_quoted = 0, False, False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "`":
                if text[i + 1 : i + 2] == "`":
                    cur.append("`")
                    i += 1
                else:
                    quoted = False
            else:
                cur.append(c)
        elif c == "`":
            quoted = was_quoted = True
        elif c == ".":
            if not cur and not was_quoted:
                raise ValueError(f"empty name part in {text!r}")
            parts.append("".join(cur))
            cur, was_quoted = [], False
        else:
            cur.append(c)
        i += 1
    if quoted:
        raise ValueError(f"unclosed backtick in {text!r}")
    if not cur and not was_quoted:
        raise ValueError(f"empty name part in {text!r}")
    parts.append("".join(cur))
    return parts


def quote(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def timestamp_literal(epoch_s: float) -> str:
    when = dt.datetime.fromtimestamp(epoch_s, dt.UTC)
    return f"TIMESTAMP '{when.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z'"


@dataclass(frozen=True)
class TableRef:
    namespace: tuple[str, ...]
    name: str
    catalog: str = "floe"

    @classmethod
    def parse(cls, text: str, catalog: str = "floe") -> TableRef:
        """`NS.T` (or `NS1.NS2.T`, or `CATALOG.NS.T` with the catalog's own name)."""
        parts = split_identifier(text.strip())
        if len(parts) >= 3 and parts[0] == catalog:
            parts = parts[1:]
        if len(parts) < 2:
            raise ValueError(f"table {text!r}: expected NAMESPACE.TABLE")
        return cls(tuple(parts[:-1]), parts[-1], catalog)

    def __str__(self) -> str:
        """NS.T, backtick-quoted only where needed."""
        return ".".join(p if p.isidentifier() else quote(p) for p in (*self.namespace, self.name))

    @property
    def sql(self) -> str:
        """The fully qualified, quoted name for SQL: `floe`.`ns`.`t`."""
        return ".".join(quote(p) for p in (self.catalog, *self.namespace, self.name))

    def metadata(self, which: str) -> str:
        """A metadata table: files, snapshots, manifests, ..."""
        return f"{self.sql}.{quote(which)}"

    @property
    def arg(self) -> str:
        """The table argument of a `CALL floe.system.*` procedure (a string literal)."""
        return sql_string(".".join(quote(p) for p in (*self.namespace, self.name)))

    @property
    def procedures(self) -> str:
        return f"{quote(self.catalog)}.system"


def _ref(table: str | TableRef, catalog: str) -> TableRef:
    return table if isinstance(table, TableRef) else TableRef.parse(table, catalog)


def _one(spark: SparkSession, query: str) -> dict[str, Any]:
    rows = spark.sql(query).collect()
    return rows[0].asDict() if rows else {}


COMMIT_ATTEMPTS = 5  # procedure calls lost to the broker's commits, beyond Iceberg's own retries


def is_commit_conflict(e: BaseException) -> bool:
    """Did a commit lose against a concurrent one (the broker's, every few seconds)?"""
    text = error_text(e)
    return "CommitFailedException" in text or "Cannot commit rewrite" in text


def _call(
    spark: SparkSession, query: str, attempts: int = COMMIT_ATTEMPTS
) -> tuple[list[dict[str, Any]], int]:
    """Run a procedure; when its commit loses to concurrent commits even after Iceberg's own
    retries (a table committed to many times a second), run it again. (rows, attempts used)"""
    for attempt in range(1, attempts + 1):
        try:
            return [r.asDict() for r in spark.sql(query).collect()], attempt
        except Exception as e:
            if attempt == attempts or not is_commit_conflict(e):
                raise
            wait = min(5.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
            log.info("commit conflict (attempt %d of %d), again in %.1fs", attempt, attempts, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")


def _options(options: Mapping[str, str]) -> str:
    args = ", ".join(f"{sql_string(k)}, {sql_string(str(v))}" for k, v in options.items())
    return f"map({args})"


# --------------------------------------------------------------------------------------------
# Looking at tables
# --------------------------------------------------------------------------------------------
def table_properties(
    spark: SparkSession, table: str | TableRef, catalog: str = "floe"
) -> dict[str, str]:
    ref = _ref(table, catalog)
    rows = spark.sql(f"SHOW TBLPROPERTIES {ref.sql}").collect()
    return {str(r["key"]): str(r["value"]) for r in rows}


def data_file_stats(
    spark: SparkSession, ref: TableRef, small_file_bytes: int = 0
) -> dict[str, int]:
    row = _one(
        spark,
        f"SELECT count(*) AS n, coalesce(sum(file_size_in_bytes), 0) AS bytes, "
        f"count_if(file_size_in_bytes < {int(small_file_bytes)}) AS small "
        f"FROM {ref.metadata('files')} WHERE content = 0",
    )
    deletes = _one(spark, f"SELECT count(*) AS n FROM {ref.metadata('files')} WHERE content > 0")
    return {
        "files": int(row["n"]),
        "bytes": int(row["bytes"]),
        "small": int(row["small"]),
        "delete_files": int(deletes["n"]),
    }


def snapshot_stats(spark: SparkSession, ref: TableRef) -> dict[str, Any]:
    row = _one(
        spark,
        "SELECT count(*) AS n, CAST(unix_millis(min(committed_at)) AS BIGINT) AS oldest "
        f"FROM {ref.metadata('snapshots')}",
    )
    return {"snapshots": int(row["n"]), "oldest_ms": row["oldest"]}


def manifest_count(spark: SparkSession, ref: TableRef) -> int:
    return int(_one(spark, f"SELECT count(*) AS n FROM {ref.metadata('manifests')}")["n"])


def table_stats(
    spark: SparkSession,
    table: str | TableRef,
    catalog: str = "floe",
    small_file_bytes: int = Thresholds.small_file_bytes,
) -> TableStats:
    ref = _ref(table, catalog)
    files = data_file_stats(spark, ref, small_file_bytes)
    snaps = snapshot_stats(spark, ref)
    return TableStats(
        table=str(ref),
        data_files=files["files"],
        data_bytes=files["bytes"],
        small_data_files=files["small"],
        delete_files=files["delete_files"],
        manifests=manifest_count(spark, ref),
        snapshots=snaps["snapshots"],
        oldest_snapshot_ms=None if snaps["oldest_ms"] is None else int(snaps["oldest_ms"]),
    )


def list_namespaces(spark: SparkSession, catalog: str = "floe") -> list[tuple[str, ...]]:
    """Every namespace of the catalog, nested ones included."""
    out: list[tuple[str, ...]] = []
    todo: list[tuple[str, ...]] = [()]
    while todo:
        parent = todo.pop()
        where = ".".join(quote(p) for p in (catalog, *parent))
        for row in spark.sql(f"SHOW NAMESPACES IN {where}").collect():
            ns = tuple(split_identifier(str(row[0])))
            if ns and ns not in out:
                out.append(ns)
                todo.append(ns)
    return sorted(out)


def list_tables(
    spark: SparkSession,
    catalog: str = "floe",
    table_topics_only: bool = True,
    namespaces: Sequence[Sequence[str]] | None = None,
) -> list[TableRef]:
    """The catalog's tables (only table topics, tabletopic.contract, unless
    `table_topics_only` is false; only in `namespaces`, if given)."""
    refs: list[TableRef] = []
    wanted = None if namespaces is None else {tuple(n) for n in namespaces}
    for ns in list_namespaces(spark, catalog):
        if wanted is not None and ns not in wanted:
            continue
        where = ".".join(quote(p) for p in (catalog, *ns))
        for row in spark.sql(f"SHOW TABLES IN {where}").collect():
            if row["isTemporary"]:
                continue
            ref = TableRef(ns, str(row["tableName"]), catalog)
            if table_topics_only:
                try:
                    if not is_table_topic(table_properties(spark, ref)):
                        continue
                except Exception as e:  # dropped meanwhile, unreadable metadata, ...
                    log.warning("table %s: cannot read its properties: %s", ref, error_text(e))
                    continue
            refs.append(ref)
    return refs


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
    ref = _ref(table, catalog)
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
    ref = _ref(table, catalog)
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
    ref = _ref(table, catalog)
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
    ref = _ref(table, catalog)
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
    ref = _ref(table, catalog)
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


def error_text(e: BaseException) -> str:
    """An error in one line: for a JVM error its class and message, and its root cause."""
    java = getattr(e, "java_exception", None)
    if java is not None:
        try:
            top = str(java.toString())
            cur, root = java, java
            for _ in range(20):
                nxt = cur.getCause()
                if nxt is None:
                    break
                root = cur = nxt
            line = top.splitlines()[0].strip()
            if root is not java:
                line += f" (caused by {str(root.toString()).splitlines()[0].strip()})"
            return line[:1000]
        except Exception:
            pass
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    name = type(e).__name__
    return (f"{name}: {text}" if text and not text.startswith("[") else text or name)[:1000]
