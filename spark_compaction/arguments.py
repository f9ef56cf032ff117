"""The command lines of `floe compact` and `floe sql` (argparse), and their value types."""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Sequence

from spark_compaction.policy import MiB, Thresholds

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


def csv(values: Sequence[str] | None) -> list[str]:
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


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
