"""Transactions with the official Java client (java/TxnCheck.java): commits and an abort across
two partitions, a zombie producer fenced by a new one with the same transactional.id, and
what read_committed and read_uncommitted consumers see. Skips like test_java_client.py when
`java` or the kafka-clients jar is missing."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess, running_broker
from tests.integration.test_java_client import JAVA, TIMEOUT_S, java_classpath

pytestmark = [pytest.mark.integration, pytest.mark.java]

PROGRAM = Path(__file__).resolve().parent / "java" / "TxnCheck.java"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "d") as b:
        yield b


def test_java_transactional_producer_and_read_committed(broker: BrokerProcess) -> None:
    assert JAVA is not None
    proc = subprocess.run(
        [JAVA, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", java_classpath(),
         str(PROGRAM), broker.bootstrap, "java-txn"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n--- broker ---\n{broker.log()[-3000:]}"
    lines = [line.split("\t") for line in proc.stdout.splitlines()]
    fenced = [f[1] for f in lines if f[0] == "FENCED"]
    assert fenced and fenced[0].rsplit(".", 1)[-1] in (
        "ProducerFencedException", "InvalidProducerEpochException"), fenced
    seen: dict[str, list[str]] = {"read_committed": [], "read_uncommitted": []}
    for f in lines:
        if f[0] == "REC":
            seen[f[1]].append(f[4])
    committed = [f"c-{i}" for i in range(6)] + ["d-0", "d-1", "f-0"]
    assert sorted(seen["read_committed"]) == sorted(committed)
    assert sorted(seen["read_uncommitted"]) == sorted(
        committed + [f"a-{i}" for i in range(4)] + ["z-0", "z-1"])


def test_java_producer_recovers_from_an_expired_transaction(broker: BrokerProcess) -> None:
    """KIP-588: the coordinator aborted the expired transaction and bumped the epoch; the
    Java producer's next send fails with a retriable epoch error, it aborts, bumps its epoch
    with InitProducerId (its id and old epoch) and commits its next transaction. The program
    aborts only once the client refuses sends: the client wakes the failed send's caller before
    it records the error, and an abort in between skips the bump (TxnCheck.awaitErrorState)."""
    assert JAVA is not None
    proc = subprocess.run(
        [JAVA, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", java_classpath(),
         str(PROGRAM), broker.bootstrap, "java-expiry", "timeout"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, (
        f"{proc.stderr[-4000:]}\n--- stdout ---\n{proc.stdout[-2000:]}"
        f"\n--- broker ---\n{broker.log()[-5000:]}"
    )
    lines = [line.split("\t") for line in proc.stdout.splitlines()]
    expired = [f[1] for f in lines if f[0] == "EXPIRED"]
    assert expired and expired[0].rsplit(".", 1)[-1] == "InvalidProducerEpochException", expired
    seen: dict[str, list[str]] = {"read_committed": [], "read_uncommitted": []}
    for f in lines:
        if f[0] == "REC":
            seen[f[1]].append(f[4])
    assert seen["read_committed"] == ["r-0"]
    assert sorted(seen["read_uncommitted"]) == ["r-0", "t-0"]
