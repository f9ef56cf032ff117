"""What the commands print: job results (JSON lines, one log line each), SQL rows as JSON
values or as an aligned text table."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from collections.abc import Sequence
from typing import Any


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, default=str), flush=True)


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


def row_dict(row: Any, columns: list[str]) -> dict[str, Any]:
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


def cell(v: Any) -> tuple[str, bool]:
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
