"""`floe sql`: one Spark SQL statement; rows printed as a text table, JSON or JSON lines."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from spark_compaction.errors import error_text
from spark_compaction.output import cell, jsonable, render_table, row_dict

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_sql(spark: SparkSession, args: argparse.Namespace) -> int:
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
                    print(json.dumps(jsonable(row_dict(row, columns)), ensure_ascii=False))
            else:
                print("[", end="")
                for i, row in enumerate(rows):
                    text = json.dumps(jsonable(row_dict(row, columns)), ensure_ascii=False)
                    print(("," if i else "") + "\n" + text, end="")
                print("\n]")
            return 0
        limit = args.max_rows if args.max_rows > 0 else None
        got = df.take(limit + 1) if limit is not None else df.collect()
        more = limit is not None and len(got) > limit
        shown = got[:limit] if limit is not None else got
        cells = [[cell(row[i]) for i in range(len(columns))] for row in shown]
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
