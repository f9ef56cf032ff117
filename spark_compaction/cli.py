"""`floe compact` and `floe sql`: Spark on the broker's Iceberg tables.

    floe compact --table NS.T            run the maintenance jobs on one table, once
    floe compact --watch [--interval S]  keep every table topic's table (tables with the
                                         property floe.topic) past the thresholds compacted
    floe sql "SELECT ..." [--json]       run Spark SQL; the catalog `floe` is the default one

The catalog comes from the broker's settings, resolved like the broker does: flags
(--data-dir, --catalog, --warehouse) > FLOE_DATA_DIR / FLOE_CATALOG / FLOE_WAREHOUSE >
--config TOML file > defaults (sqlite:///<data-dir>/catalog.db, file://<data-dir>/warehouse).

Job results are printed to stdout as JSON lines; logs go to stderr.
`python -m spark_compaction.cli ...` works as well as `floe ...`.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import decimal
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from spark_compaction.jobs import error_text
from spark_compaction.policy import MiB, Thresholds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_compaction.jobs import JobOptions, TableRef

log = logging.getLogger("floe.compact")
COMMANDS = ("compact", "sql")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration(text: str) -> dt.timedelta:
    """`90`, `90s`, `30m`, `6h`, `1d`, `2w` -> timedelta (argparse type)."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration like 90s, 30m, 6h, 1d")
    return dt.timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def size(text: str) -> int:
    """`1048576`, `512k`, `64m`, `1g` -> bytes (argparse type)."""
    m = re.match(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size like 64m or 134217728")
    return int(m.group(1)) * {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB}[m.group(2)]


def _csv(values: Sequence[str] | None) -> list[str]:
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


# --------------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("catalog (resolved like the broker's settings)")
    g.add_argument("--data-dir", help="the broker's data directory (default ./floe-data)")
    g.add_argument(
        "--catalog", help="Iceberg catalog URL (default sqlite:///<data-dir>/catalog.db)"
    )
    g.add_argument(
        "--warehouse", help="Iceberg warehouse URL (default file://<data-dir>/warehouse)"
    )
    g.add_argument("--config", help="the broker's TOML settings file")
    s = p.add_argument_group("spark")
    s.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    s.add_argument("--jars", action="append", metavar="JAR[,JAR]", help="more jars (repeatable)")
    s.add_argument(
        "--packages",
        action="append",
        metavar="G:A:V[,...]",
        help="more Maven packages, e.g. hadoop-aws for s3a:// (repeatable; needs Maven)",
    )
    s.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any Spark setting (repeatable)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `compact` and `sql` to a `floe` command line."""
    c = subparsers.add_parser(
        "compact",
        help="compact table topics' Iceberg tables with Spark",
        description="Iceberg maintenance with Spark: rewrite small data files, rewrite "
        "manifests, expire old snapshots, remove orphan files. --table runs the jobs once on "
        "one table; --watch keeps every table topic's table past the thresholds compacted. "
        "Results are printed as JSON lines.",
    )
    c.set_defaults(spark_command="compact")
    what = c.add_mutually_exclusive_group(required=True)
    what.add_argument("--table", action="append", metavar="NS.T", help="the table (repeatable)")
    what.add_argument("--watch", action="store_true", help="loop over all table topics")
    c.add_argument(
        "--interval", type=float, default=300.0, help="--watch: seconds between rounds (300)"
    )
    c.add_argument("--rounds", type=int, default=None, help="--watch: stop after this many rounds")
    c.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        help="--watch: only tables in this namespace (repeatable; default: all)",
    )
    c.add_argument(
        "--jobs",
        action="append",
        metavar="JOB[,JOB]",
        help="only these: rewrite_data_files, rewrite_manifests, expire_snapshots, "
        "remove_orphan_files (default: all)",
    )
    c.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: print each table's stats and what would run, list orphan files",
    )
    c.add_argument(
        "--quick-start",
        action="store_true",
        help="JIT with C1 only: starts faster, for small tables (tests, development)",
    )
    j = c.add_argument_group("jobs")
    j.add_argument(
        "--sort",
        metavar="COL[,COL]",
        help="rewrite data files sorted by these columns, e.g. _kafka.partition,_kafka.offset "
        "(default: table property floe.compaction.sort-columns, else bin-pack)",
    )
    j.add_argument("--target-file-size", type=size, help="data file size to aim for (512m)")
    j.add_argument(
        "--min-input-files", type=int, default=2, help="rewrite groups of at least N files (2)"
    )
    j.add_argument(
        "--snapshot-max-age",
        type=duration,
        default=dt.timedelta(hours=1),
        help="expire snapshots older than this (1h)",
    )
    j.add_argument(
        "--retain-last", type=int, default=20, help="always keep this many snapshots (20)"
    )
    j.add_argument(
        "--orphan-min-age",
        type=duration,
        default=dt.timedelta(days=1),
        help="only files older than this can be orphans (1d; at least 1d)",
    )
    t = c.add_argument_group("thresholds (--watch)")
    d = Thresholds()
    t.add_argument(
        "--small-file-size",
        type=size,
        default=d.small_file_bytes,
        help=f"a data file below this is small ({d.small_file_bytes // MiB}m)",
    )
    t.add_argument(
        "--min-small-files",
        type=int,
        default=d.min_small_files,
        help=f"rewrite data files once this many are small ({d.min_small_files})",
    )
    t.add_argument(
        "--max-manifests",
        type=int,
        default=d.max_manifests,
        help=f"rewrite manifests past this many ({d.max_manifests})",
    )
    t.add_argument(
        "--max-snapshots",
        type=int,
        default=d.max_snapshots,
        help=f"expire snapshots past this many, or once older than --snapshot-max-age "
        f"({d.max_snapshots})",
    )
    t.add_argument(
        "--orphan-interval",
        type=duration,
        default=dt.timedelta(seconds=d.orphan_interval_s),
        help="look for orphan files in a table this often (1d)",
    )
    _common(c)

    q = subparsers.add_parser(
        "sql",
        help="run Spark SQL on the Iceberg tables",
        description="Run one Spark SQL statement; `floe` (the broker's catalog) is the default "
        "catalog, so `SELECT * FROM default.t` and `floe.default.t` both work.",
    )
    q.set_defaults(spark_command="sql")
    q.add_argument("query", help='the statement ("-": read it from stdin)')
    out = q.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON array of row objects")
    out.add_argument("--jsonl", action="store_true", help="print one JSON object per row")
    q.add_argument(
        "--max-rows",
        type=int,
        default=10000,
        help="table output: show at most this many rows (0: all; JSON output: no limit)",
    )
    _common(q)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """Run a parsed `compact` or `sql` command line; returns the exit status."""
    from broker.config import ConfigError
    from spark_compaction.session import SparkSetupError

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    command = getattr(args, "spark_command", None)
    if command not in COMMANDS:
        print(f"floe: unknown command {command!r}", file=sys.stderr)
        return 2
    try:
        spark = _session(args)
    except (ConfigError, SparkSetupError, ValueError, FileNotFoundError) as e:
        print(f"floe {command}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the JVM did not start, ...
        print(f"floe {command}: cannot start Spark: {error_text(e)}", file=sys.stderr)
        return 1
    try:
        if command == "sql":
            return _sql(spark, args)
        return _compact(spark, args)
    except KeyboardInterrupt:
        return 130
    finally:
        spark.stop()


def _session(args: argparse.Namespace) -> SparkSession:
    from broker.config import load_settings
    from spark_compaction.session import catalog_kind, session, sqlite_catalog_path

    flags: dict[str, str | None] = {
        "data.dir": args.data_dir,
        "catalog": args.catalog,
        "warehouse": args.warehouse,
    }
    settings = load_settings(flags, args.config)
    catalog_url, warehouse_url = settings.catalog_url, settings.warehouse_url
    if catalog_kind(catalog_url) == "sqlite":
        path = sqlite_catalog_path(catalog_url)
        if not path.is_file():
            raise FileNotFoundError(
                f"no catalog database at {path} (the broker creates it; is --data-dir / "
                "--catalog right?)"
            )
    conf: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf {item!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return session(
        catalog_url=catalog_url,
        warehouse_url=warehouse_url,
        master=args.master,
        extra_jars=_csv(args.jars),
        packages=_csv(args.packages),
        conf=conf,
        quick_start=args.spark_command == "sql" or bool(getattr(args, "quick_start", False)),
    )


def _job_options(args: argparse.Namespace) -> JobOptions:
    from spark_compaction.jobs import JobOptions

    return JobOptions(
        sort_columns=_csv([args.sort]) if args.sort else None,
        target_file_size_bytes=args.target_file_size,
        min_input_files=args.min_input_files,
        max_snapshot_age=args.snapshot_max_age,
        retain_last=args.retain_last,
        orphan_min_age=args.orphan_min_age,
        dry_run_orphans=args.dry_run,
    )


def _thresholds(args: argparse.Namespace) -> Thresholds:
    return Thresholds(
        small_file_bytes=args.small_file_size,
        min_small_files=args.min_small_files,
        max_manifests=args.max_manifests,
        max_snapshots=args.max_snapshots,
        max_snapshot_age_s=args.snapshot_max_age.total_seconds(),
        retain_last=args.retain_last,
        orphan_interval_s=args.orphan_interval.total_seconds(),
    )


def _emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, default=str), flush=True)


def _compact(spark: SparkSession, args: argparse.Namespace) -> int:
    from spark_compaction.jobs import ALL_JOBS, TableRef, split_identifier, table_properties

    jobs = _csv(args.jobs) or list(ALL_JOBS)
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
        options = _job_options(args)
        thresholds = _thresholds(args)
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
        _emit(r)
        log.info("%s", describe(r))
    return results


def _dry_run(
    spark: SparkSession,
    ref: TableRef,
    thresholds: Thresholds,
    options: JobOptions,
    jobs: Sequence[str],
) -> bool:
    from spark_compaction.jobs import remove_orphan_files, table_stats
    from spark_compaction.policy import decide

    try:
        stats = table_stats(spark, ref, small_file_bytes=thresholds.small_file_bytes)
        decision = decide(stats, thresholds, int(time.time() * 1000))
        _emit(
            {
                "table": str(ref),
                "stats": vars(stats),
                "would_run": [j for j in decision.jobs if j in jobs],
                "reasons": {j: r for j, r in decision.reasons.items() if j in jobs},
            }
        )
        if "remove_orphan_files" in jobs:
            _emit(remove_orphan_files(spark, ref, min_age=options.orphan_min_age, dry_run=True))
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
    from spark_compaction.jobs import ALL_JOBS, list_tables, run_jobs, table_stats
    from spark_compaction.policy import decide

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
                _emit(
                    {"table": str(ref), "stats": vars(stats), "would_run": todo, "reasons": reasons}
                )
                continue
            for r in run_jobs(spark, ref, todo, options, catalog):
                if r["job"] == "remove_orphan_files" and "error" not in r:
                    last_orphan_run[str(ref)] = now_ms
                _emit(r)
                log.info("%s", describe(r))
                results.append(r)
        if rounds is not None and n >= rounds:
            break
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return results


def describe(r: dict[str, Any]) -> str:
    """One log line for a job result."""
    head = f"{r.get('table')}: {r.get('job')}"
    if "error" in r:
        return f"{head} failed: {r['error']}"
    job = r.get("job")
    if job == "rewrite_data_files":
        return (
            f"{head} ({r['strategy']}) {r['data_files_before']} -> {r['data_files_after']} "
            f"data files, {r['rewritten_data_files']} rewritten in {r['seconds']}s"
        )
    if job == "rewrite_manifests":
        return f"{head} {r['manifests_before']} -> {r['manifests_after']} manifests"
    if job == "expire_snapshots":
        return (
            f"{head} {r['snapshots_expired']} expired, {r['snapshots_after']} kept, "
            f"{r['deleted_data_files']} data files deleted"
        )
    if job == "remove_orphan_files":
        verb = "found (dry run)" if r["dry_run"] else "removed"
        return f"{head} {r['orphans_found']} orphan files {verb}"
    return f"{head} {r}"


# --------------------------------------------------------------------------------------------
# SQL
# --------------------------------------------------------------------------------------------
def _sql(spark: SparkSession, args: argparse.Namespace) -> int:
    # pyspark turns timestamps into naive datetimes in this process's time zone: make that
    # the session's (UTC), so values print as Spark shows them.
    os.environ["TZ"] = spark.conf.get("spark.sql.session.timeZone", "UTC") or "UTC"
    time.tzset()
    query = sys.stdin.read() if args.query == "-" else args.query
    try:
        df = spark.sql(query.strip().rstrip(";"))
        columns = list(df.columns)
        if args.json or args.jsonl:
            rows: Iterable[Any] = df.toLocalIterator()
            if args.jsonl:
                for row in rows:
                    print(json.dumps(jsonable(_row_dict(row, columns)), ensure_ascii=False))
            else:
                print("[", end="")
                for i, row in enumerate(rows):
                    text = json.dumps(jsonable(_row_dict(row, columns)), ensure_ascii=False)
                    print(("," if i else "") + "\n" + text, end="")
                print("\n]")
            return 0
        limit = args.max_rows if args.max_rows > 0 else None
        got = df.take(limit + 1) if limit is not None else df.collect()
        more = limit is not None and len(got) > limit
        shown = got[:limit] if limit is not None else got
        cells = [[_cell(row[i]) for i in range(len(columns))] for row in shown]
        print(render_table(columns, cells))
        n = len(shown)
        note = f"({n} row{'s' if n != 1 else ''}"
        note += "; more not shown, see --max-rows)" if more else ")"
        print(note, file=sys.stderr)
        return 0
    except Exception as e:
        if type(e).__module__.startswith(("pyspark", "py4j")):
            print(f"floe sql: {error_text(e)}", file=sys.stderr)
            return 1
        raise


def _row_dict(row: Any, columns: list[str]) -> dict[str, Any]:
    return {c: row[i] for i, c in enumerate(columns)}  # by position: names may repeat


def jsonable(v: Any) -> Any:
    """Spark values as JSON values: binary as base64, times as ISO 8601, decimals as strings,
    structs as objects, maps as objects (keys as strings)."""
    from pyspark.sql import Row

    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, Row):
        return {k: jsonable(x) for k, x in v.asDict(recursive=False).items()}
    if isinstance(v, dict):
        return {str(jsonable(k)): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    return str(v)


def _cell(v: Any) -> tuple[str, bool]:
    """(text, right-aligned)"""
    if v is None:
        return "NULL", False
    if isinstance(v, bool):
        return str(v).lower(), False
    if isinstance(v, int | float | decimal.Decimal):
        return str(v), True
    if isinstance(v, bytes | bytearray | memoryview):
        raw = bytes(v)
        try:
            text = raw.decode("utf-8")
            if text.isprintable():
                return text, False
        except UnicodeDecodeError:
            pass
        return "0x" + raw.hex(), False
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" "), False
    if isinstance(v, str):
        return v, False
    return json.dumps(jsonable(v), ensure_ascii=False), False


def render_table(columns: Sequence[str], rows: Sequence[Sequence[tuple[str, bool]]]) -> str:
    """An aligned text table: a header, a rule, the rows (numbers right-aligned)."""
    clean = [[(t.replace("\n", "\\n").replace("\t", " "), r) for t, r in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in clean:
        for i, (text, _right) in enumerate(row):
            widths[i] = max(widths[i], len(text))
    right = [bool(clean) and all(row[i][1] for row in clean) for i in range(len(columns))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(widths[i]) if right[i] else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return " | ".join(parts).rstrip()

    out = [line(list(columns)), "-+-".join("-" * w for w in widths)]
    out += [line([t for t, _r in row]) for row in clean]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Standalone: python -m spark_compaction.cli compact|sql ...
# --------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floe", description="Spark on floe's Iceberg tables")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
