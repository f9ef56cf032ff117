"""Upsert table topics: commit rows/s of an upsert table against an append table, and Spark's
read time of the upsert table before and after `floe compact`, all in one run.

    python -m benchmarks.upsertbench [--commits 20] [--rows 5000] [--keys 20000] [--out F]

Both tables get the same Debezium-flattened batches (tabletopic.transformconvert's columns:
id, name, balance, _cdc, _kafka; 10% of the events deletes, keys drawn uniformly from --keys),
committed with the broker's own commit (tabletopic.commit.commit_offsets): the append table as
is, the upsert table with `Upsert(("id",), "_cdc.op")` (tabletopic.upsert: latest row per key,
copy-on-write delete of the keys touched, append). The figures are ratios against the append
baseline measured in the same run; absolute times depend on the machine. Spark: a local
session on the same catalog, warmed up on the append table, times `SELECT *` (collected) of
the upsert table, median of 5, then `floe compact --table` (spark_compaction.compact.
run_compact, every job) runs, then the same query again.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from tabletopic.commit import commit_offsets
from tabletopic.convert import KAFKA_TYPE
from tabletopic.transformconvert import CDC_TYPE
from tabletopic.upsert import Upsert

NS = "bench"


def batches(commits: int, rows: int, keys: int, seed: int = 15) -> list[pa.Table]:
    rng = random.Random(seed)
    out, offset = [], 0
    for _ in range(commits):
        ids = [rng.randrange(keys) for _ in range(rows)]
        ops = ["D" if rng.random() < 0.1 else "U" for _ in range(rows)]
        offs = list(range(offset, offset + rows))
        offset += rows
        out.append(pa.table({
            "_kafka": pa.array([{"partition": 0, "offset": o, "timestamp": None, "key": None,
                                 "headers": []} for o in offs], KAFKA_TYPE),
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"name-{i}-{o}" for i, o in zip(ids, offs, strict=True)]),
            "balance": pa.array([o * 7 % 10_000 for o in offs], pa.int64()),
            "_cdc": pa.array([{"op": op, "ts": o, "offset": o, "source": "shop.accounts"}
                              for op, o in zip(ops, offs, strict=True)], CDC_TYPE),
        }))
    return out


def write(catalog: Any, name: str, data: list[pa.Table], upsert: Upsert | None) -> float:
    """Commit every batch; returns the seconds the commits took."""
    catalog.create_table((NS, name), schema=pa.schema([pa.field("_kafka", KAFKA_TYPE,
                                                                 nullable=False)]),
                         properties={"format-version": "2", "floe.topic": name})
    offset, took = 0, 0.0
    for b in data:
        t0 = time.perf_counter()
        commit_offsets(catalog, (NS, name), name, b, {0: offset}, {0: offset + b.num_rows},
                       upsert=upsert)
        took += time.perf_counter() - t0
        offset += b.num_rows
    return took


def spark_read_s(spark: Any, table: str, repeat: int = 5) -> float:
    spark.sql(f"REFRESH TABLE {table}")
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        spark.sql(f"SELECT * FROM {table}").collect()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compact(spark: Any, data_dir: Path, table: str) -> int:
    from spark_compaction.arguments import add_parsers
    from spark_compaction.compact import run_compact

    parser = argparse.ArgumentParser(prog="floe")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["compact", "--data-dir", str(data_dir), "--table", table])
    return run_compact(spark, args)


def run(commits: int, rows: int, keys: int, spark: bool) -> dict[str, Any]:
    from pyiceberg.catalog.sql import SqlCatalog

    with tempfile.TemporaryDirectory(prefix="floe-upsertbench-") as tmp:
        data_dir = Path(tmp)
        catalog = SqlCatalog("floe", uri=f"sqlite:///{data_dir / 'catalog.db'}",
                             warehouse=(data_dir / "warehouse").as_uri())
        catalog.create_namespace(NS)
        data = batches(commits, rows, keys)
        total = commits * rows
        append_s = write(catalog, "appended", data, None)
        upsert_s = write(catalog, "upserted", data, Upsert(("id",), "_cdc.op"))
        table = catalog.load_table((NS, "upserted"))
        out: dict[str, Any] = {
            "commits": commits, "rows_per_commit": rows, "keys": keys,
            "append_rows_per_s": round(total / append_s),
            "upsert_rows_per_s": round(total / upsert_s),
            "upsert_vs_append": round(append_s / upsert_s, 3),
            "upsert_table_rows": table.scan().to_arrow().num_rows,
            "upsert_table_files": len(table.inspect.files()),
        }
        if spark:
            from spark_compaction.session import session

            s = session(data_dir=data_dir, quick_start=True)
            try:
                name = f"floe.{NS}.upserted"
                spark_read_s(s, f"floe.{NS}.appended", repeat=3)  # JVM warm-up, not measured
                before = spark_read_s(s, name)
                status = compact(s, data_dir, f"{NS}.upserted")
                after = spark_read_s(s, name)
                out.update({
                    "spark_read_before_compact_s": round(before, 4),
                    "spark_read_after_compact_s": round(after, 4),
                    "after_vs_before": round(after / before, 3),
                    "compact_exit": status,
                    "files_after_compact": len(catalog.load_table((NS, "upserted"))
                                               .inspect.files()),
                })
            finally:
                s.stop()
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.upsertbench")
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--rows", type=int, default=5000, help="rows per commit")
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark read / compaction")
    ap.add_argument("--out", help="write the figures as JSON here too")
    args = ap.parse_args(argv)
    result = run(args.commits, args.rows, args.keys, not args.no_spark)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
