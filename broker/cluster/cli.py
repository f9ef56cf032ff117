"""`floe cluster status [--metadata URL | --metrics HOST:PORT] [--json]` (broker.cluster.status)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from broker.cluster.status import ClusterStatus, as_json, read_admin, read_metadata, render


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("cluster", help="the cluster: brokers, leases, leaders, coordinators")
    c.add_argument("action", choices=["status"])
    where = c.add_mutually_exclusive_group()
    where.add_argument("--metadata", help="the cluster's metadata database URL (read directly)")
    where.add_argument("--metrics", help="a broker's admin HOST:PORT (default FLOE_METRICS or"
                       " 127.0.0.1:9644); lists brokers and leases, not partitions")
    c.add_argument("--json", action="store_true", help="machine-readable output")


async def _from_metadata(url: str) -> ClusterStatus:
    from s3stream.metadata import open_metadata_store

    parsed = urlparse(url)
    if parsed.scheme == "sqlite" and not Path(url[len("sqlite:///"):]).exists():
        raise OSError(f"no metadata database at {url}")
    store = open_metadata_store(url)
    await store.open()
    try:
        return await store._run(read_metadata, store)
    finally:
        await store.close()


def run(args: argparse.Namespace) -> int:
    from broker.admin import DEFAULT_ADDRESS

    try:
        if args.metadata:
            status = asyncio.run(_from_metadata(args.metadata))
        else:
            status = read_admin(args.metrics or os.environ.get("FLOE_METRICS") or DEFAULT_ADDRESS)
    except Exception as e:
        print(f"floe cluster status: {e}", file=sys.stderr)
        return 1
    print(json.dumps(as_json(status), indent=2) if args.json else render(status))
    return 0
