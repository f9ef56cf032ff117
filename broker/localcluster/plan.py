"""What a local cluster runs: the shared URLs and each broker's `floe broker` flags.

Pure functions, no processes: `floe local-cluster` runs these command lines, and
tests/unit/test_deploy_compose.py compares deploy/docker-compose.yml's brokers with them, so
the compose file and the local cluster cannot drift apart.

Ports with `--base-port P` (P > 0), broker i = 1..N:
    Kafka            P + i - 1            (9092, 9093, 9094 by default)
    admin (--metrics) P + 100 + i - 1     (/metrics, /status: 9192, ...)
    Schema Registry  P + 200, broker 1 only (the others run with --schema-registry '')
With P = 0 every port is a free one picked at start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from broker.localcluster.s3server import s3_url

OBJECT_BUCKET, OBJECT_PREFIX = "floe", "log"
WAREHOUSE_BUCKET, WAREHOUSE_PREFIX = "warehouse", "tables"
DATABASE = "floe"  # the PostgreSQL database holding the metadata and the Iceberg catalog
ADMIN_OFFSET, REGISTRY_OFFSET = 100, 200
HOST = "127.0.0.1"


@dataclass(frozen=True)
class SharedUrls:
    """What every broker of the cluster shares."""

    object_store: str
    metadata: str
    catalog: str
    warehouse: str


@dataclass(frozen=True)
class BrokerSpec:
    node_id: int
    listen: str  # HOST:PORT bound
    advertised: str  # HOST:PORT given to clients
    metrics: str  # the admin HOST:PORT
    schema_registry: str  # HOST:PORT, or "" (off)
    data_dir: Path
    rack: str  # broker.rack: zone-a, zone-b, zone-c, zone-a, ...


def plan_brokers(
    n: int, base_port: int, data_dir: Path, host: str = HOST,
    pick_port: Callable[[], int] | None = None,
) -> list[BrokerSpec]:
    """N brokers, node ids 1..N. base_port 0: each port from `pick_port` (a free port)."""
    if n < 1:
        raise ValueError("a cluster has at least one broker")

    picked: set[int] = set()

    def port(offset: int) -> int:
        if base_port:
            return base_port + offset
        if pick_port is None:
            raise ValueError("base port 0 needs pick_port")
        # a free port is free until bound, and the system may hand the same one out twice in
        # a row (broker 1's admin port and the registry's once were one: the registry failed
        # to bind): each port of the plan is another
        for _ in range(100):
            p = pick_port()
            if p not in picked:
                picked.add(p)
                return p
        raise RuntimeError("no distinct free port after 100 picks")

    specs = []
    for i in range(n):
        addr = f"{host}:{port(i)}"
        specs.append(BrokerSpec(
            node_id=i + 1,
            listen=addr,
            advertised=addr,
            metrics=f"{host}:{port(ADMIN_OFFSET + i)}",
            schema_registry=f"{host}:{port(REGISTRY_OFFSET)}" if i == 0 else "",
            data_dir=data_dir / f"broker-{i + 1}",
            rack=f"zone-{'abc'[i % 3]}",
        ))
    return specs


def s3_urls(endpoint: str) -> tuple[str, str]:
    """The object store and warehouse URLs on an S3-compatible endpoint."""
    return (s3_url(OBJECT_BUCKET, OBJECT_PREFIX, endpoint),
            s3_url(WAREHOUSE_BUCKET, WAREHOUSE_PREFIX, endpoint))


def warehouse_beside(object_store: str, cluster_dir: Path) -> str:
    """The warehouse for a given object store URL: on S3, bucket `warehouse` with the same
    parameters (endpoint, region, path style); otherwise a directory of the cluster."""
    parts = urlsplit(object_store)
    if parts.scheme == "s3":
        return f"s3://{WAREHOUSE_BUCKET}/{WAREHOUSE_PREFIX}" + (f"?{parts.query}"
                                                              if parts.query else "")
    return (cluster_dir / "warehouse").resolve().as_uri()


def bucket_of(s3_store_url: str) -> tuple[str, str | None]:
    """(bucket, endpoint or None) of an s3:// URL."""
    parts = urlsplit(s3_store_url)
    endpoint = dict(parse_qsl(parts.query)).get("endpoint")
    return parts.netloc, endpoint


def broker_args(spec: BrokerSpec, urls: SharedUrls) -> list[str]:
    """`floe broker` flags of one broker (after the `broker` subcommand)."""
    return [
        "--node-id", str(spec.node_id),
        "--rack", spec.rack,
        "--listen", spec.listen,
        "--advertised", spec.advertised,
        "--data-dir", str(spec.data_dir),
        "--object-store", urls.object_store,
        "--metadata", urls.metadata,
        "--catalog", urls.catalog,
        "--warehouse", urls.warehouse,
        "--metrics", spec.metrics,
        "--schema-registry", spec.schema_registry,
    ]
