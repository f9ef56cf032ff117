"""`floe`: the command-line entry point."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from broker.config import BROKER_CONFIGS, ConfigError, env_name, load_settings
from broker.topics_cli import add_parser as add_topics_parser
from broker.topics_cli import run as run_topics

BROKER_FLAGS = {  # flag -> setting key
    "listen": "listen",
    "advertised": "advertised",
    "data_dir": "data.dir",
    "node_id": "node.id",
    "rack": "broker.rack",
    "object_store": "object.store",
    "metadata": "metadata",
    "log_level": "log.level",
    "catalog": "catalog",
    "warehouse": "warehouse",
    "metrics": "metrics",
    "schema_registry": "schema.registry",
    "schema_registry_url": "schema.registry.url",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="floe", description="Kafka-compatible broker on object storage"
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "broker",
        help="run a broker",
        description="Run a broker. Every setting can also come from FLOE_<NAME> environment "
        "variables or a TOML --config file (flags win, then environment, then file).",
    )
    b.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:9092; port 0 = any)")
    b.add_argument("--advertised", help="HOST:PORT given to clients (default: the bound address)")
    b.add_argument("--data-dir", help="local data directory (default ./floe-data)")
    b.add_argument("--node-id", help="this broker's id (default 0)")
    b.add_argument("--rack", help="this broker's rack or zone (broker.rack; shown in Metadata)")
    b.add_argument("--object-store", help="object store URL (default file://<data-dir>/objects)")
    b.add_argument("--metadata", help="metadata store URL (default sqlite:///<data-dir>/meta.db)")
    b.add_argument("--log-level", help="debug | info | warning | error")
    b.add_argument(
        "--catalog", help="Iceberg catalog URL (default sqlite:///<data-dir>/catalog.db)"
    )
    b.add_argument(
        "--warehouse", help="Iceberg warehouse URL (default file://<data-dir>/warehouse)"
    )
    b.add_argument(
        "--metrics",
        help="admin HOST:PORT serving /metrics and /status (default 127.0.0.1:9644; '' disables)",
    )
    b.add_argument(
        "--schema-registry",
        help="HOST:PORT serving the Schema Registry (default 127.0.0.1:8081, off when "
        "--schema-registry-url is set; '' disables)",
    )
    b.add_argument(
        "--schema-registry-url",
        help="http(s)://HOST:PORT of an external Confluent-compatible Schema Registry that "
        "produce validation and table topics read instead of the built-in one",
    )
    b.add_argument("--config", help="TOML file of settings")
    b.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other setting, e.g. --set num.partitions=3 (repeatable)",
    )
    b.add_argument(
        "--print-settings",
        action="store_true",
        help="print every setting with where it came from, then exit",
    )
    add_topics_parser(sub)
    from broker.localcluster.launcher import add_parser as add_local_cluster_parser

    add_local_cluster_parser(sub)
    from tabletopic.table_cli import add_parser as add_table_parser

    add_table_parser(sub)
    from broker.cluster.cli import add_parser as add_cluster_parser

    add_cluster_parser(sub)
    from broker.txn.cli import add_parser as add_transactions_parser

    add_transactions_parser(sub)
    g = sub.add_parser("groups", help="consumer groups: list, or describe with lag")
    g.add_argument("action", choices=["list", "describe"])
    g.add_argument("group", nargs="?")
    g.add_argument(
        "--bootstrap", help="HOST:PORT of a broker (default FLOE_BOOTSTRAP or 127.0.0.1:9092)"
    )
    g.add_argument("--json", action="store_true", help="machine-readable output")
    from spark_compaction.arguments import add_parsers as add_spark_parsers

    add_spark_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "broker":
        return _broker(args)
    if args.command == "groups":
        return _groups(args)
    if args.command == "local-cluster":
        from broker.localcluster.launcher import run as run_local_cluster

        return run_local_cluster(args)
    if args.command == "table":
        return _table(args)
    if args.command == "cluster":
        from broker.cluster.cli import run as run_cluster

        return run_cluster(args)
    if args.command == "transactions":
        from broker.txn.cli import run as run_transactions

        return run_transactions(args)
    if args.command in ("compact", "sql"):
        from spark_compaction.cli import run as run_spark

        return run_spark(args)
    if args.command == "topics":
        import os

        return run_topics(
            args, args.bootstrap or os.environ.get("FLOE_BOOTSTRAP", "127.0.0.1:9092")
        )
    return 2


def _table(args: argparse.Namespace) -> int:
    import json
    import os

    from broker.admin import DEFAULT_ADDRESS
    from tabletopic.status import fetch_full_status, render, render_health

    address = args.metrics or os.environ.get("FLOE_METRICS") or DEFAULT_ADDRESS
    if args.action != "status":
        from tabletopic.table_cli import run as run_table

        return run_table(args, address)
    try:
        doc = fetch_full_status(address)
    except OSError as e:
        print(f"floe table status: cannot reach the broker's admin port {address}: {e}",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(doc["tables"], indent=2))
        return 0
    unhealthy = render_health(doc.get("health", {}))
    print((unhealthy + "\n" if unhealthy else "") + render(doc["tables"]))
    return 0


def _groups(args: argparse.Namespace) -> int:
    import json
    import os

    from broker.client import KafkaClientError
    from broker.groups.describe import describe_group, list_groups, render

    bootstrap = args.bootstrap or os.environ.get("FLOE_BOOTSTRAP", "127.0.0.1:9092")
    try:
        if args.action == "list":
            groups = list_groups(bootstrap)
            if args.json:
                print(json.dumps([{"group": g, "state": s} for g, s in groups]))
            else:
                for g, s in groups:
                    print(f"{g}\t{s}")
            return 0
        if not args.group:
            print("floe groups describe: name a group", file=sys.stderr)
            return 2
        print(render(describe_group(bootstrap, args.group), args.json))
        return 0
    except KafkaClientError as e:
        print(f"floe groups: {e}", file=sys.stderr)
        return 1


def _broker(args: argparse.Namespace) -> int:
    flags: dict[str, str | None] = {key: getattr(args, flag) for flag, key in BROKER_FLAGS.items()}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in BROKER_CONFIGS:
            print(
                f"floe: --set {item!r}: expected KEY=VALUE with KEY one of "
                f"{', '.join(sorted(BROKER_CONFIGS))}",
                file=sys.stderr,
            )
            return 2
        flags[key] = value
    try:
        settings = load_settings(flags, args.config)
    except ConfigError as e:
        print(f"floe: {e}", file=sys.stderr)
        return 2
    if settings.memory_trim_interval_ms and settings.sources.get("memory.trim.interval.ms") != (
        "default"
    ):
        from broker.memtrim import malloc_trim

        if malloc_trim() is None:
            print(
                "floe: memory.trim.interval.ms: this C library has no malloc_trim (glibc only);"
                " set it to 0",
                file=sys.stderr,
            )
            return 2
    if args.print_settings:
        for key, value, source in settings.describe():
            print(f"{key} = {value}    ({source}; env {env_name(key)})")
        return 0
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from broker.memtrim import arrow_pool

    arrow_pool()  # before pyarrow is imported (broker/memtrim.py)
    from broker.app import run_broker
    from s3stream.metadata import SchemaTooNewError

    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # uvloop is optional (not on Windows)
        pass
    try:
        run(run_broker(settings))
    except SchemaTooNewError as e:  # one clear line, no traceback: nothing was written
        print(f"floe: SchemaTooNewError: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
