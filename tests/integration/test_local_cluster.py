"""`floe local-cluster --brokers 3` as a user runs it: a child process whose printed lines are
the interface. Each broker must answer a real client (librdkafka) with its own node id, the S3
server and the metadata database must be reachable at the printed URLs, a broker that dies is
reported while the others keep serving, and SIGTERM must leave no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
from confluent_kafka.admin import AdminClient

from broker.client import Client
from broker.localcluster.launcher import UNSAFE_WARNING
from broker.localcluster.postgres import PostgresUnavailable, find_bindir, server_user
from tests.pg import in_ci

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READY_TIMEOUT_S = 180.0  # 3 brokers (+ PostgreSQL) on 2 shared cores
EXIT_TIMEOUT_S = 60.0
REQUIRED = ("bootstrap", "object-store", "metadata", "catalog", "warehouse", "schema-registry")


def require_postgres() -> None:
    why = None
    try:
        server_user()
    except PostgresUnavailable as e:
        why = str(e)
    if find_bindir() is None:
        why = "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found"
    if why is not None:
        if in_ci():
            pytest.fail(f"{why}; CI is set, so this fails instead of skipping", pytrace=False)
        pytest.skip(why)


def children_of(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc (ppid is the 4th field of /proc/N/stat)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def refuses(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


@dataclass
class Launcher:
    proc: subprocess.Popen[str]
    stderr_path: Path
    lines: list[str] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)  # every descendant seen, and the postmaster

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise AssertionError(f"no line {prefix!r}; stdout:\n" + "\n".join(self.lines)
                             + "\nstderr:\n" + self.stderr_path.read_text(errors="replace"))

    def value(self, key: str) -> str:
        return self.wait_for(f"{key}: ", 0).split(": ", 1)[1]


@contextlib.contextmanager
def local_cluster(tmp_path: Path, metadata: str) -> Iterator[Launcher]:
    stderr_path = tmp_path / "launcher.err"
    cmd = [sys.executable, "-m", "broker.cli", "local-cluster", "--brokers", "3",
           "--base-port", "0", "--metadata", metadata, "--data-dir", str(tmp_path / "cluster")]
    with stderr_path.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    launcher = Launcher(proc, stderr_path)
    pump = threading.Thread(target=launcher.pump, daemon=True)
    pump.start()
    try:
        yield launcher
    except BaseException:  # what the brokers said goes into the failure's captured output
        for log in sorted((tmp_path / "cluster").glob("*/broker.log")):
            print(f"--- {log} (last 100 lines) ---")
            print("".join(log.read_text(errors="replace").splitlines(True)[-100:]), end="")
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for pid in launcher.pids:  # only after a failure is anything left to clean up
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pump.join(10)
        if proc.stdout is not None:
            proc.stdout.close()


def kafka_node_id(address: str) -> int:
    """The node id a real client learns, from the broker at `address`'s Metadata answer, for
    the broker at `address` (the launcher says ready once every broker lists all three)."""
    admin = AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 10000})
    md = admin.list_topics(timeout=20)
    ids = [b.id for b in md.brokers.values() if f"{b.host}:{b.port}" == address]
    assert len(ids) == 1, md.brokers
    return int(ids[0])


def check_store_and_database(launcher: Launcher) -> None:
    import boto3
    import psycopg

    store, warehouse = launcher.value("object-store"), launcher.value("warehouse")
    endpoint = dict(parse_qsl(urlsplit(store).query))["endpoint"]
    assert dict(parse_qsl(urlsplit(warehouse).query))["endpoint"] == endpoint
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        buckets = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    finally:
        s3.close()
    assert {urlsplit(store).netloc, urlsplit(warehouse).netloc} <= buckets

    metadata = launcher.value("metadata")
    query = "SELECT component FROM schema_version"
    if metadata.startswith("postgresql://"):
        assert launcher.value("catalog") == metadata
        with psycopg.connect(metadata, connect_timeout=10) as conn:
            components = {r[0] for r in conn.execute(query).fetchall()}
    else:
        assert launcher.value("catalog").startswith("sqlite:///")
        con = sqlite3.connect(metadata[len("sqlite:///"):], timeout=10)
        try:
            components = {r[0] for r in con.execute(query).fetchall()}
        finally:
            con.close()
    assert "s3stream.metadata" in components  # the brokers migrated the shared database

    registry = launcher.value("schema-registry")
    with urllib.request.urlopen(f"{registry}/subjects", timeout=10) as resp:
        assert resp.status == 200


@pytest.mark.parametrize("metadata", ["sqlite", "postgresql"])
def test_local_cluster_runs_reports_and_stops_cleanly(tmp_path: Path, metadata: str) -> None:
    if metadata == "postgresql":
        require_postgres()
    with local_cluster(tmp_path, metadata) as launcher:
        launcher.wait_for("local cluster ready", READY_TIMEOUT_S)
        launcher.pids |= children_of(launcher.proc.pid)
        if metadata == "postgresql":
            postmaster = int(launcher.value("postgres").split()[1])
            launcher.pids |= {postmaster, *children_of(postmaster)}
        assert UNSAFE_WARNING in launcher.stderr_path.read_text()  # what is not safe yet
        bootstrap = launcher.value("bootstrap").split(",")
        assert len(bootstrap) == 3 and len(set(bootstrap)) == 3
        for address in bootstrap:  # ready: each broker's own Metadata lists all three
            with Client(address) as c:
                md = c.request(3, 9, topics=(), allow_auto_topic_creation=False,
                               include_cluster_authorized_operations=False,
                               include_topic_authorized_operations=False)
            assert sorted(int(b.node_id) for b in md.brokers) == [1, 2, 3], address
        assert [kafka_node_id(a) for a in bootstrap] == [1, 2, 3]
        check_store_and_database(launcher)

        # a broker that dies is reported; the others keep serving
        pid2 = int(launcher.value("broker 2").split()[1])
        os.kill(pid2, signal.SIGKILL)
        reported = launcher.wait_for("broker 2 (pid", 30)
        assert reported.endswith("exited with code -9; 2 broker(s) keep running"), reported
        assert kafka_node_id(bootstrap[2]) == 3

        endpoint = dict(parse_qsl(urlsplit(launcher.value("object-store")).query))["endpoint"]
        db = urlsplit(launcher.value("metadata"))
        launcher.proc.send_signal(signal.SIGTERM)
        assert launcher.proc.wait(EXIT_TIMEOUT_S) == 0
        assert launcher.lines[-1] == "stopping"
        left = [p for p in launcher.pids if alive(p)]
        assert not left, f"processes left behind: {left}"
        for address in [*bootstrap, urlsplit(endpoint).netloc]:
            assert refuses(address), f"{address} still accepts connections"
        if db.scheme == "postgresql":
            assert refuses(f"{db.hostname}:{db.port}")


def test_a_data_dir_from_an_earlier_run_is_refused(tmp_path: Path) -> None:
    """moto keeps objects in memory: metadata left in the directory would point at nothing."""
    (tmp_path / "meta.db").write_bytes(b"")
    out = subprocess.run(
        [sys.executable, "-m", "broker.cli", "local-cluster", "--base-port", "0",
         "--metadata", "sqlite", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2, out
    assert "is not empty" in out.stderr and UNSAFE_WARNING in out.stderr
    assert "bootstrap:" not in out.stdout
