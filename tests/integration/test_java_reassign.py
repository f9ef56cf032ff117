"""Partition reassignment with the official Java Admin client (java/ReassignCheck.java) on two
floe brokers sharing a SQLite metadata file: alterPartitionReassignments moves partition 0 to
the other broker, listPartitionReassignments is empty once it is there, and the refusals and
the cancel surface as the Java client's exceptions. Skips like test_java_client.py when `java`
or the kafka-clients jar is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.test_cluster import cluster, create_topic, leaders, wait_for
from tests.integration.test_java_client import JAVA, TIMEOUT_S, java_classpath

pytestmark = [pytest.mark.integration, pytest.mark.java, pytest.mark.slow]

PROGRAM = Path(__file__).resolve().parent / "java" / "ReassignCheck.java"


def test_java_admin_reassigns_a_partition(tmp_path: Path) -> None:
    assert JAVA is not None
    metadata = f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    with cluster(tmp_path, metadata, 2) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "jr", 2)
        placed: dict[int, int] = {}
        wait_for("one partition per broker", lambda: placed.update(leaders(bootstrap, "jr"))
                 or sorted(placed.values()) == [1, 2])
        target = 3 - placed[0]
        proc = subprocess.run(
            [JAVA, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", java_classpath(),
             str(PROGRAM), bootstrap, "jr", str(target), str(placed[0])],
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )
        logs = "".join(b.log()[-2000:] for b in brokers)
        assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n--- brokers ---\n{logs}"
        out = {f[0]: f[1:] for f in (line.split("\t") for line in proc.stdout.splitlines())}
        print(f"\n{proc.stdout}")
        assert out["ALTER"] == ["ok"]
        assert out["LEADER"][0] == str(target)
        assert out["LISTED"] == ["0"]
        assert out["BOGUS"] == ["org.apache.kafka.common.errors.InvalidReplicaAssignmentException"]
        assert out["MULTI"] == ["org.apache.kafka.common.errors.InvalidReplicaAssignmentException"]
        assert out["CANCEL"] == ["ok"]
        assert out["CANCEL_AGAIN"] == [
            "org.apache.kafka.common.errors.NoReassignmentInProgressException"]
        wait_for("every broker's view to have partition 0 on the target", lambda: all(
            leaders(b.bootstrap, "jr")[0] == target for b in brokers), timeout=10)
