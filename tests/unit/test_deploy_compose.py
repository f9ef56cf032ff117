"""deploy/docker-compose.yml runs the brokers `floe local-cluster` runs (Docker does not run
here, so this is what keeps the compose file honest): each broker service's `floe broker`
flags are the ones broker/localcluster builds for the same node id, with the same values
except host names (and the data directory, a local path); the Spark container, MinIO's
buckets and PostgreSQL's database are the ones those flags name."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml

from broker.localcluster.plan import (
    DATABASE,
    SharedUrls,
    broker_args,
    plan_brokers,
    s3_urls,
)
from broker.localcluster.postgres import PgServer

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml"
ADDRESS_FLAGS = {"--listen", "--advertised", "--metrics", "--schema-registry"}
URL_FLAGS = {"--object-store", "--metadata", "--catalog", "--warehouse"}


def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def flags(argv: list[str]) -> list[tuple[str, str]]:
    """`--flag value` pairs, in order (every broker flag here takes a value)."""
    assert len(argv) % 2 == 0 and all(a.startswith("--") for a in argv[::2]), argv
    return list(zip(argv[::2], argv[1::2], strict=True))


def without_host(flag: str, value: str) -> object:
    """What must match between the local cluster and compose: everything but host names."""
    if flag in ADDRESS_FLAGS:
        return value.rpartition(":")[2] if value else ""  # the port; "" (off) stays ""
    if flag == "--data-dir":
        return "a directory"
    if flag in URL_FLAGS:
        u = urlsplit(value)
        query = dict(parse_qsl(u.query))
        if "endpoint" in query:
            query["endpoint"] = urlsplit(query["endpoint"]).scheme + "://<host>:<port>"
        return (u.scheme, u.username, u.password, u.netloc if u.scheme == "s3" else "<host>",
                u.path, sorted(query.items()))
    return value


def local_cluster_brokers() -> dict[int, list[str]]:
    """What `floe local-cluster --brokers 3 --metadata postgresql` runs (default ports)."""
    store, warehouse = s3_urls("http://127.0.0.1:5000")
    pg = PgServer(Path("/pg"), Path("/pg/data"), 5432, None).url(DATABASE)
    urls = SharedUrls(store, pg, pg, warehouse)
    specs = plan_brokers(3, 9092, Path("/tmp/cluster"))
    return {s.node_id: broker_args(s, urls) for s in specs}


def broker_services() -> dict[int, dict[str, Any]]:
    services = compose()["services"]
    out = {}
    for svc in services.values():
        command = svc.get("command")
        if isinstance(command, list) and "--node-id" in command:
            out[int(command[command.index("--node-id") + 1])] = svc
    return out


def test_compose_has_the_local_clusters_three_brokers() -> None:
    assert sorted(broker_services()) == sorted(local_cluster_brokers()) == [1, 2, 3]


@pytest.mark.parametrize("node_id", [1, 2, 3])
def test_each_broker_runs_the_local_clusters_flags(node_id: int) -> None:
    svc = broker_services()[node_id]
    local = flags(local_cluster_brokers()[node_id])
    deployed = flags(svc["command"])
    assert [f for f, _ in deployed] == [f for f, _ in local]
    for (flag, want), (_, got) in zip(local, deployed, strict=True):
        assert without_host(flag, got) == without_host(flag, want), (flag, got, want)
    advertised = dict(deployed)["--advertised"]
    assert advertised.split(":")[0] == svc["hostname"] == f"broker{node_id}"
    published = {p.split(":")[0] for p in svc["ports"]}
    assert {v.rpartition(":")[2] for f, v in deployed if f in ADDRESS_FLAGS and v} <= published


def test_spark_buckets_and_database_are_the_ones_the_brokers_name() -> None:
    doc = compose()
    services = doc["services"]
    broker = dict(flags(broker_services()[1]["command"]))
    spark = services["spark"]["command"]
    assert spark[:2] == ["compact", "--watch"]
    spark_flags = dict(flags(spark[2:]))
    assert spark_flags["--catalog"] == broker["--catalog"] == broker["--metadata"]
    assert spark_flags["--warehouse"] == broker["--warehouse"]
    setup = services["minio-setup"]["entrypoint"]
    for url in (broker["--object-store"], broker["--warehouse"]):
        assert f"mc mb -p local/{urlsplit(url).netloc}" in setup
        endpoint = dict(parse_qsl(urlsplit(url).query))["endpoint"]
        assert urlsplit(endpoint).hostname in services
    pg = urlsplit(broker["--metadata"])
    env = services["postgres"]["environment"]
    assert (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]) == (
        pg.username, pg.password, pg.path.lstrip("/"))
    assert pg.hostname in services
    for svc in [*broker_services().values(), services["spark"]]:  # MinIO's root user
        minio = services["minio"]["environment"]
        assert svc["environment"]["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
        assert svc["environment"]["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]


def test_each_broker_has_its_own_zone() -> None:
    """Brokers 1-3 in zone-a, zone-b, zone-c (`--rack`, the broker.rack setting), as in the
    local cluster (compared flag by flag above)."""
    racks = {n: dict(flags(svc["command"]))["--rack"] for n, svc in broker_services().items()}
    assert racks == {1: "zone-a", 2: "zone-b", 3: "zone-c"}


def test_the_rack_flag_is_the_broker_rack_setting(capsys: pytest.CaptureFixture[str]) -> None:
    from broker.cli import main

    assert main(["broker", "--rack", "zone-b", "--print-settings"]) == 0
    assert any(line.split()[:4] == ["broker.rack", "=", "zone-b", "(flag;"]
               for line in capsys.readouterr().out.splitlines())


def test_picked_ports_of_a_plan_are_all_distinct() -> None:
    """With --base-port 0 every port is a free one picked at start; the system may hand the
    same free port out twice in a row (it did: broker 1's admin port was the registry's, and
    the registry failed to bind). A plan never uses one port twice."""
    handed = iter([5001, 5001, 5002, 5002, 5002, 5003, 5001, 5004, 5005, 5006, 5007, 5008])
    specs = plan_brokers(3, 0, Path("/tmp/cluster"), pick_port=lambda: next(handed))
    ports = [int(a.rsplit(":", 1)[1]) for s in specs
             for a in (s.listen, s.metrics, s.schema_registry) if a]
    assert len(ports) == 7 and len(set(ports)) == 7, ports
