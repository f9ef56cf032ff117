"""Zone awareness for consumers (issue 12; KIP-392, fetch from the closest replica): three
brokers in zone-a, zone-b, zone-c share one object store and metadata database; a
confluent_kafka consumer with client.rack=zone-c is sent by the leaders of the other zones'
partitions to the zone-c broker, which serves them read-only from the store
(`floe_fetch_replica_bytes_total` on its /metrics proves it); the zone-c broker SIGKILLed, the
consumer goes back to the leaders and loses nothing. Real `floe broker` processes on
127.0.0.1."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from tests.brokerproc import BrokerProcess
from tests.integration.test_cluster import create_topic, leaders, wait_for
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT_S = 30.0
ZONES = {1: "zone-a", 2: "zone-b", 3: "zone-c"}
PARTITIONS = 3


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    return str(request.getfixturevalue("pg_url"))


@contextmanager
def zoned_cluster(tmp_path: Path, metadata: str, *args: str) -> Iterator[list[BrokerProcess]]:
    shared = ["--object-store", (tmp_path / "objects").resolve().as_uri(), "--metadata", metadata]
    brokers: list[BrokerProcess] = []
    try:
        for n, zone in ZONES.items():
            b = BrokerProcess(tmp_path / f"b{n}",
                              ["--node-id", str(n), "--rack", zone, *shared, *args])
            brokers.append(b.start())
        yield brokers
    finally:
        for b in brokers:
            b.stop()


def replica_bytes(b: BrokerProcess) -> float:
    """The broker's floe_fetch_replica_bytes_total (bytes served as a read replica)."""
    with urllib.request.urlopen(f"http://{b.admin_address()}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^floe_fetch_replica_bytes_total (\S+)$", text, re.M)
    assert m is not None, "no floe_fetch_replica_bytes_total"
    return float(m.group(1))


def produce(bootstrap: str, values: dict[int, list[bytes]]) -> None:
    """Every value acknowledged (acks=all, idempotent), in order per partition."""
    failed: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(str(err))

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "message.timeout.ms": 60000})
    for partition, vs in values.items():
        for v in vs:
            p.produce("z", v, partition=partition, on_delivery=on_delivery)
            p.poll(0)
    assert p.flush(TIMEOUT_S) == 0
    assert not failed, failed[:3]


def batch(tag: str, n: int) -> dict[int, list[bytes]]:
    return {p: [f"{tag}-{p}-{i}".encode() for i in range(n)] for p in range(PARTITIONS)}


class Reader:
    def __init__(self, bootstrap: str, rack: str | None) -> None:
        conf = {"bootstrap.servers": bootstrap, "group.id": "zoned",
                "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000}
        if rack is not None:
            conf["client.rack"] = rack
        self.c = Consumer(conf)
        self.c.assign([TopicPartition("z", p, 0) for p in range(PARTITIONS)])
        self.got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}

    def until(self, want: dict[int, list[bytes]], timeout: float = TIMEOUT_S) -> None:
        """Consume until each partition has exactly `want` (values, in order, offsets
        consecutive from 0)."""
        deadline = time.monotonic() + timeout
        while any(len(self.got[p]) < len(v) for p, v in want.items()):
            assert time.monotonic() < deadline, {p: len(v) for p, v in self.got.items()}
            for m in self.c.consume(num_messages=500, timeout=0.2):
                partition, offset, value = m.partition(), m.offset(), m.value()
                if m.error() is None and partition is not None and offset is not None:
                    self.got[partition].append((offset, value or b""))
        for p, vs in want.items():
            assert [v for _, v in self.got[p]] == vs, f"partition {p}"
            assert [o for o, _ in self.got[p]] == list(range(len(vs))), f"partition {p}"

    def close(self) -> None:
        self.c.close()


def test_a_consumer_reads_from_the_broker_of_its_zone(tmp_path: Path, metadata: str) -> None:
    with zoned_cluster(tmp_path, metadata) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        zone_c = brokers[2]
        create_topic(bootstrap, "z", PARTITIONS)
        placed: dict[int, int] = {}
        wait_for("one partition per broker", lambda: placed.update(leaders(bootstrap, "z"))
                 or sorted(placed.values()) == [1, 2, 3])
        elsewhere = [p for p, n in placed.items() if n != 3]
        want = batch("a", 300)
        produce(bootstrap, want)

        # a consumer without client.rack reads from the leaders only
        plain = Reader(bootstrap, None)
        plain.until(want)
        plain.close()
        assert [replica_bytes(b) for b in brokers] == [0, 0, 0]

        # client.rack=zone-c: the partitions led in zone-a and zone-b come from zone-c
        reader = Reader(bootstrap, "zone-c")
        try:
            reader.until(want)
            served = replica_bytes(zone_c)
            size = sum(len(v) for p in elsewhere for v in want[p])
            assert served >= size, (served, size)  # every record of them (plus batch headers)
            assert replica_bytes(brokers[0]) == 0 and replica_bytes(brokers[1]) == 0

            # records produced while it consumes arrive (the replica refreshes)
            more = batch("b", 200)
            began = time.monotonic()
            produce(bootstrap, more)
            for p in want:
                want[p] += more[p]
            reader.until(want)
            assert time.monotonic() - began < 10
            assert replica_bytes(zone_c) > served

            # the zone-c broker dies: the consumer goes back to the leaders, loses nothing
            zone_c.kill()
            late = batch("c", 100)
            produce(bootstrap, late)  # zone-c's own partition moves to a live broker
            for p in want:
                want[p] += late[p]
            reader.until(want, timeout=60)
        finally:
            reader.close()


@pytest.mark.java
def test_the_java_consumer_reads_from_the_broker_of_its_zone(tmp_path: Path) -> None:
    """The same with the official Java consumer (java/RackConsumerCheck.java): SQLite
    metadata; skips like test_java_client.py when `java` or the kafka-clients jar is
    missing."""
    from tests.integration.test_java_client import JAVA, java_classpath

    if JAVA is None:
        pytest.skip("no java")
    program = Path(__file__).resolve().parent / "java" / "RackConsumerCheck.java"
    metadata = f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    with zoned_cluster(tmp_path, metadata) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "z", PARTITIONS)
        placed: dict[int, int] = {}
        wait_for("one partition per broker", lambda: placed.update(leaders(bootstrap, "z"))
                 or sorted(placed.values()) == [1, 2, 3])
        want = batch("j", 200)
        produce(bootstrap, want)
        proc = subprocess.run(
            [JAVA, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", java_classpath(),
             str(program), bootstrap, "z", str(PARTITIONS), "zone-c",
             str(sum(len(v) for v in want.values()))],
            capture_output=True, text=True, timeout=90,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        for line in proc.stdout.splitlines():
            f = line.split("\t")
            if f[0] == "R":
                got[int(f[1])].append((int(f[2]), f[3].encode()))
        for p, vs in want.items():
            assert [v for _, v in got[p]] == vs, (
                f"partition {p} of {placed}: {proc.stdout[-300:]}")
            assert [o for o, _ in got[p]] == list(range(len(vs)))
        elsewhere = [p for p, n in placed.items() if n != 3]
        size = sum(len(v) for p in elsewhere for v in want[p])
        assert replica_bytes(brokers[2]) >= size
        assert replica_bytes(brokers[0]) == 0 and replica_bytes(brokers[1]) == 0


def test_replica_selection_off_keeps_every_consumer_on_the_leaders(tmp_path: Path) -> None:
    """replica.selector.class '' (Kafka's default): client.rack changes nothing."""
    metadata = f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    with zoned_cluster(tmp_path, metadata, "--set", "replica.selector.class=") as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "z", PARTITIONS)
        placed: dict[int, int] = {}
        wait_for("one partition per broker", lambda: placed.update(leaders(bootstrap, "z"))
                 or sorted(placed.values()) == [1, 2, 3])
        want = batch("o", 100)
        produce(bootstrap, want)
        reader = Reader(bootstrap, "zone-c")
        try:
            reader.until(want)
        finally:
            reader.close()
        assert [replica_bytes(b) for b in brokers] == [0, 0, 0]
