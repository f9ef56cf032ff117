"""`floe local-cluster`: an S3 server, a metadata database and N brokers on 127.0.0.1.

Start order: S3 (moto, unless --object-store names a store) and its buckets, the metadata
database (a throwaway PostgreSQL when its binaries are installed, else a SQLite file shared by
the brokers), then the brokers; the stop order is the reverse (an ExitStack).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from broker.localcluster import postgres
from broker.localcluster.brokers import BrokerProcess, StartError, stop_brokers, wait_ready
from broker.localcluster.plan import (
    DATABASE,
    SharedUrls,
    broker_args,
    bucket_of,
    plan_brokers,
    s3_urls,
    warehouse_beside,
)
from broker.localcluster.s3server import (
    LOCAL_AWS_ENV,
    UNSET_AWS_ENV,
    MotoMissing,
    create_buckets,
    moto_s3,
)

UNSAFE_WARNING = (
    "WARNING: the cluster is partly built (issue 12): partitions and consumer groups move "
    "between brokers (leases, leader epochs, fenced WAL commits, placed group coordinators), "
    "but a table topic whose partitions are led by several brokers stalls (issue 13). Do not "
    "keep data in it that depends on that."
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "local-cluster",
        help="run N brokers, an S3 server and a metadata database on 127.0.0.1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__ + """
Prints `bootstrap: HOST:PORT,...`, `catalog:`, `warehouse:`, `metadata:`, `object-store:` and
`schema-registry:` lines once every broker answers, and stops everything on Ctrl-C or SIGTERM
(brokers first: SIGTERM, then SIGKILL after --stop-timeout). A broker that exits on its own is
reported (node id, exit code) and the others keep running, as a cluster should survive a broker
death; when no broker is left the command exits with status 1. Ports with --base-port P:
Kafka P+i-1, admin P+100+i-1 (broker i), Schema Registry P+200 (broker 1 only); P=0: any free
ports. With moto (the default) objects live in memory: the data directory must be empty.
What several brokers do and do not do yet: see deploy/README.md.""",
    )
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (3)")
    p.add_argument("--data-dir", help="directory of the cluster (default: a temporary one, "
                   "deleted at exit)")
    p.add_argument("--object-store", help="an s3:// URL of a running S3-compatible store (its "
                   "bucket and the warehouse's, `warehouse`, are created if missing); default: "
                   "start moto's S3 server")
    p.add_argument("--metadata", default="auto", help="'postgresql' (start a throwaway "
                   "PostgreSQL), 'sqlite' (one file shared by the brokers), 'auto' (PostgreSQL "
                   "when installed; the default) or a metadata URL to use as it is")
    p.add_argument("--base-port", type=int, default=9092, help="first Kafka port (9092); 0: "
                   "free ports")
    p.add_argument("--start-timeout", type=float, default=90.0,
                   help="seconds for every broker to answer (90)")
    p.add_argument("--stop-timeout", type=float, default=15.0,
                   help="seconds a broker gets after SIGTERM before SIGKILL (15)")


def _say(line: str) -> None:
    print(line, flush=True)


def _metadata(choice: str, cluster_dir: Path, stack: ExitStack) -> tuple[str, str]:
    """(metadata URL, catalog URL); starts PostgreSQL if that is the choice."""
    sqlite = (f"sqlite:///{(cluster_dir / 'meta.db').resolve()}",
              f"sqlite:///{(cluster_dir / 'catalog.db').resolve()}")
    if choice == "sqlite":
        return sqlite
    if choice in ("postgresql", "auto"):
        try:
            server = postgres.throwaway_server()
        except postgres.PostgresUnavailable as e:
            if choice == "postgresql":
                raise
            print(f"local-cluster: no PostgreSQL ({e}): SQLite metadata", file=sys.stderr)
            return sqlite
        stack.callback(postgres.discard, server)
        url = server.create_database(DATABASE)
        _say(f"postgres: pid {server.pid()} data {server.datadir}")
        return url, url
    if choice.startswith(("postgresql://", "postgres://")):
        return choice, choice  # the catalog's tables live beside the metadata tables
    return choice, sqlite[1]


def _object_store(given: str | None, cluster_dir: Path, stack: ExitStack
                  ) -> tuple[str, str, dict[str, str]]:
    """(object store URL, warehouse URL, environment for the brokers); starts moto if none
    is given and creates the buckets."""
    if given is None:
        endpoint = stack.enter_context(moto_s3())
        env = {**LOCAL_AWS_ENV}
        store, warehouse = s3_urls(endpoint)
    else:
        env = {}
        store, warehouse = given, warehouse_beside(given, cluster_dir)
    buckets = [bucket_of(u) for u in (store, warehouse) if u.startswith("s3://")]
    if buckets:
        create_buckets(buckets[0][1], [b for b, _ in buckets], {**os.environ, **env})
    return store, warehouse, env


def _fresh_dir(given: str | None, moto: bool) -> tuple[Path, bool]:
    """(cluster directory, whether to delete it at exit)."""
    if given is None:
        return Path(tempfile.mkdtemp(prefix="floe-local-cluster-")), True
    path = Path(given).resolve()
    if moto and path.exists() and any(path.iterdir()):
        raise ValueError(f"--data-dir {path} is not empty: moto keeps objects in memory, so a "
                         "previous run's metadata would point at objects that are gone")
    path.mkdir(parents=True, exist_ok=True)
    return path, False


def run(args: argparse.Namespace) -> int:
    if args.brokers < 1:
        print("floe local-cluster: --brokers must be at least 1", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    print(UNSAFE_WARNING, file=sys.stderr, flush=True)
    try:
        cluster_dir, temporary = _fresh_dir(args.data_dir, args.object_store is None)
    except ValueError as e:
        print(f"floe local-cluster: {e}", file=sys.stderr)
        return 2
    try:
        with ExitStack() as stack:
            return _run(args, cluster_dir, stack, stop)
    except (StartError, MotoMissing, postgres.PostgresUnavailable) as e:
        print(f"floe local-cluster: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:  # e.g. a given store that cannot be reached: one line, no traceback
        print(f"floe local-cluster: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if temporary:
            shutil.rmtree(cluster_dir, ignore_errors=True)


def _run(args: argparse.Namespace, cluster_dir: Path, stack: ExitStack,
         stop: threading.Event) -> int:
    store, warehouse, aws_env = _object_store(args.object_store, cluster_dir, stack)
    metadata, catalog = _metadata(args.metadata, cluster_dir, stack)
    urls = SharedUrls(store, metadata, catalog, warehouse)
    env = {k: v for k, v in os.environ.items() if not (aws_env and k in UNSET_AWS_ENV)}
    env.update(aws_env)
    env["PYTHONUNBUFFERED"] = "1"
    specs = plan_brokers(args.brokers, args.base_port, cluster_dir, pick_port=postgres.free_port)
    brokers = [BrokerProcess(s, broker_args(s, urls), env) for s in specs]
    stack.callback(stop_brokers, brokers, args.stop_timeout)
    # The first broker creates the shared schemas (metadata migrations, the Iceberg catalog's
    # tables) alone: pyiceberg's SqlCatalog does not survive several processes creating its
    # tables at once (a UniqueViolation on PostgreSQL). Then the others start together, and
    # every broker, the first one too, must list them all.
    deadline = time.monotonic() + args.start_timeout
    for group in (brokers[:1], brokers):
        for b in group:
            if b.proc is None:
                b.start()
        wait_ready(group, max(0.0, deadline - time.monotonic()), stop)
    if stop.is_set():
        return 0
    for b in brokers:
        _say(f"broker {b.spec.node_id}: pid {b.pid} kafka {b.spec.listen} admin {b.spec.metrics} "
             f"log {b.log_path}")
    _say("bootstrap: " + ",".join(s.advertised for s in specs))
    _say(f"object-store: {store}")
    _say(f"metadata: {metadata}")
    _say(f"catalog: {catalog}")
    _say(f"warehouse: {warehouse}")
    _say(f"schema-registry: http://{specs[0].schema_registry}")
    _say(f"local cluster ready: {len(brokers)} brokers (Ctrl-C or SIGTERM stops it)")
    return _supervise(brokers, stop)


def _supervise(brokers: list[BrokerProcess], stop: threading.Event) -> int:
    """Until a signal: report each broker that exits; 1 once none is left."""
    while not stop.wait(0.2):
        for b in brokers:
            code = b.exit_code()
            if code is not None and not b.exit_reported:
                b.exit_reported = True
                left = sum(1 for x in brokers if x.exit_code() is None)
                _say(f"broker {b.spec.node_id} (pid {b.pid}) exited with code {code}; "
                     f"{left} broker(s) keep running")
        if all(b.exit_reported for b in brokers):
            print("floe local-cluster: no broker left, stopping", file=sys.stderr, flush=True)
            return 1
    _say("stopping")
    return 0
