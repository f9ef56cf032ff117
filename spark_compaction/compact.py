"""`floe compact`: the maintenance jobs on the tables named (--table), once, or on every table
topic past the thresholds (--watch); --dry-run changes nothing. Results go to stdout as JSON
lines (spark_compaction.output)."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_compaction.arguments import csv
from spark_compaction.errors import error_text
from spark_compaction.output import describe, emit
from spark_compaction.policy import Thresholds
from spark_compaction.settings import job_options_from_args, thresholds_from_args

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_compaction.jobs import JobOptions
    from spark_compaction.names import TableRef

log = logging.getLogger("floe.compact")


def run_compact(spark: SparkSession, args: argparse.Namespace) -> int:
    from spark_compaction.jobs import ALL_JOBS
    from spark_compaction.names import TableRef, split_identifier
    from spark_compaction.tables import table_properties

    jobs = csv(args.jobs) or list(ALL_JOBS)
    unknown = sorted(set(jobs) - set(ALL_JOBS))
    if unknown:
        print(
            f"floe compact: unknown job(s) {', '.join(unknown)} (known: {', '.join(ALL_JOBS)})",
            file=sys.stderr,
        )
        return 2
    if args.orphan_min_age < dt.timedelta(days=1):
        print("floe compact: --orphan-min-age must be at least 1d", file=sys.stderr)
        return 2
    try:
        options = job_options_from_args(args)
        thresholds = thresholds_from_args(args)
    except ValueError as e:
        print(f"floe compact: {e}", file=sys.stderr)
        return 2
    if args.watch:
        watch(
            spark,
            options,
            thresholds,
            jobs=jobs,
            interval_s=args.interval,
            rounds=args.rounds,
            dry_run=args.dry_run,
            namespaces=[split_identifier(n) for n in args.namespace or ()] or None,
        )
        return 0
    failed = False
    for text in args.table:
        try:
            ref = TableRef.parse(text)
        except ValueError as e:
            print(f"floe compact: {e}", file=sys.stderr)
            return 2
        try:
            table_properties(spark, ref)
        except Exception as e:
            print(f"floe compact: {ref}: {error_text(e)}", file=sys.stderr)
            failed = True
            continue
        if args.dry_run:
            failed |= not _dry_run(spark, ref, thresholds, options, jobs)
            continue
        for r in _run_table(spark, ref, jobs, options):
            failed |= "error" in r
    return 1 if failed else 0


def _run_table(
    spark: SparkSession, ref: TableRef, jobs: Sequence[str], options: JobOptions
) -> list[dict[str, Any]]:
    from spark_compaction.jobs import run_jobs

    results = run_jobs(spark, ref, jobs, options)
    for r in results:
        emit(r)
        log.info("%s", describe(r))
    return results


def _dry_run(
    spark: SparkSession,
    ref: TableRef,
    thresholds: Thresholds,
    options: JobOptions,
    jobs: Sequence[str],
) -> bool:
    from spark_compaction.jobs import remove_orphan_files
    from spark_compaction.policy import decide
    from spark_compaction.tables import table_stats

    try:
        stats = table_stats(spark, ref, small_file_bytes=thresholds.small_file_bytes)
        decision = decide(stats, thresholds, int(time.time() * 1000))
        emit(
            {
                "table": str(ref),
                "stats": vars(stats),
                "would_run": [j for j in decision.jobs if j in jobs],
                "reasons": {j: r for j, r in decision.reasons.items() if j in jobs},
            }
        )
        if "remove_orphan_files" in jobs:
            emit(remove_orphan_files(spark, ref, min_age=options.orphan_min_age, dry_run=True))
        return True
    except Exception as e:
        print(f"floe compact: {ref}: {error_text(e)}", file=sys.stderr)
        return False


def watch(
    spark: SparkSession,
    options: JobOptions,
    thresholds: Thresholds,
    jobs: Sequence[str] | None = None,
    interval_s: float = 300.0,
    rounds: int | None = None,
    dry_run: bool = False,
    catalog: str = "floe",
    namespaces: Sequence[Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Every `interval_s`: for each table with the property floe.topic (in `namespaces`, if
    given), gather its stats, and run the jobs the thresholds call for (only those in `jobs`).
    Returns the last round's results."""
    from spark_compaction.jobs import ALL_JOBS, run_jobs
    from spark_compaction.policy import decide
    from spark_compaction.tables import list_tables, table_stats

    allowed = set(jobs or ALL_JOBS)
    last_orphan_run: dict[str, int] = {}
    n = 0
    results: list[dict[str, Any]] = []
    while rounds is None or n < rounds:
        n += 1
        started = time.monotonic()
        results = []
        try:
            tables = list_tables(spark, catalog, namespaces=namespaces)
        except Exception as e:
            log.warning("cannot list the catalog's tables: %s", error_text(e))
            tables = []
        log.info("round %d: %d table topic table(s)", n, len(tables))
        for ref in tables:
            try:
                stats = table_stats(spark, ref, catalog, thresholds.small_file_bytes)
            except Exception as e:
                log.warning("%s: cannot read its stats: %s", ref, error_text(e))
                continue
            now_ms = int(time.time() * 1000)
            decision = decide(stats, thresholds, now_ms, last_orphan_run.get(str(ref)))
            todo = [j for j in decision.jobs if j in allowed]
            if not todo:
                log.debug("%s: nothing to do (%s)", ref, stats)
                continue
            why = "; ".join(f"{j}: {decision.reasons[j]}" for j in todo)
            log.info("%s: %s", ref, why)
            if dry_run:
                reasons = {j: decision.reasons[j] for j in todo}
                emit(
                    {"table": str(ref), "stats": vars(stats), "would_run": todo, "reasons": reasons}
                )
                continue
            for r in run_jobs(spark, ref, todo, options, catalog):
                if r["job"] == "remove_orphan_files" and "error" not in r:
                    last_orphan_run[str(ref)] = now_ms
                emit(r)
                log.info("%s", describe(r))
                results.append(r)
        if rounds is not None and n >= rounds:
            break
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return results
