"""The official Java client reads what floe's topic configs make of a log: batches re-encoded
for compression.type (its LZ4 and snappy readers are the strictest about framing) and batches
rewritten by the log cleaner (gaps, KIP-534 delete horizons, empty batches)."""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess, running_broker
from tests.integration.test_java_client import (
    CODECS,
    JAVA,
    N_RECORDS,
    _failure_context,
    check_codec,
    java_classpath,
    parse_roundtrip,
    run_java,
)
from tests.integration.test_topic_configs import FAST, read_log, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.java, pytest.mark.slow]


@pytest.mark.parametrize("stored", ["lz4", "snappy", "zstd", "gzip"])
def test_java_client_reads_recompressed_batches(tmp_path: Path, stored: str) -> None:
    """Must survive: with the broker default compression.type=STORED, batches the Java client
    produces with every codec are re-encoded as STORED and the Java consumer reads back every
    record, header, timestamp and acknowledged offset."""
    with running_broker(tmp_path / "d", "--set", f"compression.type={stored}") as broker:
        proc = run_java(broker, "roundtrip-all", str(N_RECORDS), "java-rc", *CODECS)
        out = parse_roundtrip(proc.stdout)
        failures = {}
        for codec in CODECS:
            try:
                check_codec(codec, out)
            except AssertionError as e:
                failures[codec] = str(e)
        assert not failures and proc.returncode == 0, (
            f"{failures}\n{_failure_context(proc, broker)}"
        )


READER = Path(__file__).parent / "java" / "CompactedRead.java"


def java_read(broker: BrokerProcess, topic: str) -> tuple[list[tuple[int, bytes | None,
                                                                     bytes | None, int]], int]:
    """(offset, key, value, timestamp) of every record the Java consumer reads from offset 0
    to the end offset, and the position it ends at."""
    assert JAVA is not None
    proc = subprocess.run([JAVA, "-cp", java_classpath(), str(READER), broker.bootstrap, topic],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def field(v: str) -> bytes | None:
        return None if v == "-" else base64.b64decode(v)

    recs, end = [], -1
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "REC":
            recs.append((int(parts[1]), field(parts[2]), field(parts[3]), int(parts[4])))
        elif parts[0] == "END":
            end = int(parts[1])
    return recs, end


def test_java_client_reads_cleaned_compacted_topics(tmp_path: Path) -> None:
    """Must survive: the Java consumer reads a cleaned compacted topic from offset 0: exactly
    the latest record per key at its offset with its producer timestamp (tombstones too, whose
    batches carry a delete horizon), and it reaches the end offset past a cleaned-away tail
    (empty batch)."""
    with running_broker(tmp_path / "d", *FAST) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([
            NewTopic("kept", 1, 1, config={"cleanup.policy": "compact",
                                           "delete.retention.ms": "3600000"}),
            NewTopic("tail", 1, 1, config={"cleanup.policy": "compact",
                                           "delete.retention.ms": "0"}),
        ])["kept"].result(10)
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        ts0 = int(time.time() * 1000) - 60_000
        sent: dict[str, list[tuple[bytes, bytes | None, int]]] = {"kept": [], "tail": []}
        for i in range(300):
            key = b"k%02d" % (i % 40)
            value = None if i >= 280 and i % 2 else b"v%d" % i
            sent["kept"].append((key, value, ts0 + i))
        sent["tail"] = [(b"keep", b"1", ts0)] + [(b"gone-%d" % i, b"x", ts0) for i in range(5)]
        sent["tail"] += [(b"gone-%d" % i, None, ts0) for i in range(5)]
        for topic, items in sent.items():
            for key, value, ts in items:
                p.produce(topic, key=key, value=value, timestamp=ts)
            assert p.flush(30) == 0
        latest = {key: (off, value, ts) for off, (key, value, ts) in enumerate(sent["kept"])}
        wait_until(lambda: len(read_log(broker.bootstrap, "kept")) == len(latest), 30,
                   "cleaning of 'kept'")
        wait_until(lambda: len(read_log(broker.bootstrap, "tail")) == 1, 30,
                   "cleaning of 'tail'")
        recs, end = java_read(broker, "kept")
        assert end == 300
        assert {k: (off, v, ts) for off, k, v, ts in recs} == latest
        assert len(recs) == len(latest) and any(v is None for _, _, v, _ in recs)
        recs, end = java_read(broker, "tail")
        assert end == 11 and [(o, k, v) for o, k, v, _ in recs] == [(0, b"keep", b"1")]
