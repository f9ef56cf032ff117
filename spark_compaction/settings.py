"""From a parsed command line to what the commands run with: the Spark session on the broker's
catalog (settings resolved like the broker does, broker.config), job options and thresholds."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from spark_compaction.arguments import csv
from spark_compaction.policy import Thresholds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_compaction.jobs import JobOptions


def spark_session(args: argparse.Namespace) -> SparkSession:
    """The Spark session on the catalog of the broker's settings (flags > FLOE_* > --config)."""
    from broker.config import load_settings
    from spark_compaction.catalog import catalog_kind, sqlite_catalog_path
    from spark_compaction.session import session

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
        extra_jars=csv(args.jars),
        packages=csv(args.packages),
        conf=conf,
        quick_start=args.spark_command == "sql" or bool(getattr(args, "quick_start", False)),
    )


def job_options_from_args(args: argparse.Namespace) -> JobOptions:
    from spark_compaction.jobs import JobOptions

    return JobOptions(
        sort_columns=csv([args.sort]) if args.sort else None,
        target_file_size_bytes=args.target_file_size,
        min_input_files=args.min_input_files,
        max_snapshot_age=args.snapshot_max_age,
        retain_last=args.retain_last,
        orphan_min_age=args.orphan_min_age,
        dry_run_orphans=args.dry_run,
    )


def thresholds_from_args(args: argparse.Namespace) -> Thresholds:
    return Thresholds(
        small_file_bytes=args.small_file_size,
        min_small_files=args.min_small_files,
        max_manifests=args.max_manifests,
        max_snapshots=args.max_snapshots,
        max_snapshot_age_s=args.snapshot_max_age.total_seconds(),
        retain_last=args.retain_last,
        orphan_interval_s=args.orphan_interval.total_seconds(),
    )
