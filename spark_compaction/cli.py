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

Modules: arguments (command lines), settings (session, options), compact, sql, output.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from spark_compaction.arguments import add_parsers
from spark_compaction.errors import error_text

COMMANDS = ("compact", "sql")


def run(args: argparse.Namespace) -> int:
    """Run a parsed `compact` or `sql` command line; returns the exit status."""
    from broker.config import ConfigError
    from spark_compaction.compact import run_compact
    from spark_compaction.jars import SparkSetupError
    from spark_compaction.settings import spark_session
    from spark_compaction.sql import run_sql

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
        spark = spark_session(args)
    except (ConfigError, SparkSetupError, ValueError, FileNotFoundError) as e:
        print(f"floe {command}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the JVM did not start, ...
        print(f"floe {command}: cannot start Spark: {error_text(e)}", file=sys.stderr)
        return 1
    try:
        if command == "sql":
            return run_sql(spark, args)
        return run_compact(spark, args)
    except KeyboardInterrupt:
        return 130
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floe", description="Spark on floe's Iceberg tables")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
