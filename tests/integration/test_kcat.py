"""kcat (a librdkafka 2.0.2 build) against a real floe broker process.

kcat's line-oriented producer cannot set per-record timestamps or per-record headers, so each
record carries the same static headers and the producer's CreateTime; the timestamps are
checked to lie within the time the producer ran, everything else exactly.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.conftest import kcat_binary
from tests.integration.workload import CODECS, Consumed, Rec, check_consumed, expected_records

KCAT = kcat_binary()

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(KCAT is None, reason="kcat/kafkacat not installed"),
]

N = 2_000
PARTITIONS = 3
TIMEOUT_S = 60.0
FORMAT = r"%p\t%o\t%K\t%k\t%S\t%s\t%h\t%T\n"
# the same for every record: kcat -H sets headers per invocation
STATIC_HEADERS = (("src", b"kcat"), ("codec", b""))


def kcat(broker: BrokerProcess, *args: str, stdin: bytes | None = None) -> tuple[bytes, str]:
    assert KCAT is not None
    proc = subprocess.run(
        [KCAT, "-b", broker.bootstrap, *args],
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, (
        f"kcat {' '.join(args)} exited {proc.returncode}\nstderr:\n{stderr}\n"
        f"broker log tail:\n{broker.log()[-4000:]}"
    )
    return proc.stdout, stderr


def create_topic(broker: BrokerProcess, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], request_timeout=30
    )
    futures[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        t = admin.list_topics(topic=name, timeout=30).topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        assert time.monotonic() < deadline, f"topic {name} not in metadata: {t!r}"
        time.sleep(0.1)


def headers_for(codec: str) -> tuple[tuple[str, bytes], ...]:
    return tuple((k, codec.encode() if k == "codec" else v) for k, v in STATIC_HEADERS)


def parse_headers(text: str) -> tuple[tuple[str, bytes], ...]:
    if not text:
        return ()
    out = []
    for item in text.split(","):
        k, _, v = item.partition("=")
        out.append((k, v.encode()))
    return tuple(out)


def parse_consumed(out: bytes) -> list[Consumed]:
    consumed = []
    for line in out.decode().splitlines():
        p, o, klen, k, vlen, v, h, ts = line.split("\t")
        key = None if int(klen) < 0 else k.encode()
        value = None if int(vlen) < 0 else v.encode()
        assert key is None or len(key) == int(klen), line
        assert value is None or len(value) == int(vlen), line
        consumed.append(
            Consumed(
                partition=int(p),
                offset=int(o),
                key=key,
                value=value,
                headers=parse_headers(h),
                timestamp_ms=int(ts),
            )
        )
    return consumed


def test_metadata_list(broker: BrokerProcess) -> None:
    create_topic(broker, "meta-a", partitions=3)
    create_topic(broker, "meta-b", partitions=1)

    out, _ = kcat(broker, "-L", "-J")
    md = json.loads(out)
    assert [b["name"] for b in md["brokers"]] == [broker.bootstrap], md["brokers"]
    broker_id = md["brokers"][0]["id"]
    assert md["controllerid"] == broker_id
    topics = {t["topic"]: t for t in md["topics"]}
    assert {"meta-a", "meta-b"} <= set(topics), sorted(topics)
    for name, count in (("meta-a", 3), ("meta-b", 1)):
        t = topics[name]
        assert "error" not in t, t
        assert sorted(p["partition"] for p in t["partitions"]) == list(range(count))
        for p in t["partitions"]:
            assert "error" not in p, p
            assert p["leader"] == broker_id
            assert [r["id"] for r in p["replicas"]] == [broker_id]
            assert [r["id"] for r in p["isrs"]] == [broker_id]

    text, _ = kcat(broker, "-L")
    listing = text.decode()
    assert " 1 brokers:" in listing, listing
    assert f"broker {broker_id} at {broker.bootstrap} (controller)" in listing, listing
    assert 'topic "meta-a" with 3 partitions:' in listing, listing
    assert 'topic "meta-b" with 1 partitions:' in listing, listing


def test_metadata_one_topic(broker: BrokerProcess) -> None:
    create_topic(broker, "only", partitions=2)
    out, _ = kcat(broker, "-L", "-J", "-t", "only")
    md = json.loads(out)
    assert [t["topic"] for t in md["topics"]] == ["only"]
    assert len(md["topics"][0]["partitions"]) == 2


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume(broker: BrokerProcess, codec: str) -> None:
    topic = f"kc-{codec}"
    create_topic(broker, topic)
    headers = headers_for(codec)
    records = [replace(r, headers=headers) for r in expected_records(N, PARTITIONS, tag=codec)]

    header_args: list[str] = []
    for k, v in headers:
        header_args += ["-H", f"{k}={v.decode()}"]
    before_ms = int(time.time() * 1000)
    for p in range(PARTITIONS):
        lines = b"".join(r.key + b":" + r.value + b"\n" for r in records if r.partition == p)
        _, stderr = kcat(
            broker,
            "-P", "-t", topic, "-p", str(p), "-K:", "-z", codec, *header_args,
            "-X", "acks=all", "-X", "linger.ms=5", "-X", "message.timeout.ms=30000",
            stdin=lines,
        )  # fmt: skip
        assert "ERROR" not in stderr and "failed" not in stderr.lower(), stderr
    after_ms = int(time.time() * 1000)

    out, stderr = kcat(
        broker,
        "-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", FORMAT,
        "-X", "check.crcs=true",
    )  # fmt: skip
    assert "ERROR" not in stderr, stderr
    consumed = parse_consumed(out)
    for c in consumed:
        assert before_ms - 1000 <= c.timestamp_ms <= after_ms + 1000, (
            f"p{c.partition}@{c.offset}: timestamp {c.timestamp_ms} outside "
            f"[{before_ms}, {after_ms}] (the producer's CreateTime)"
        )
    # timestamps checked above; compare everything else exactly
    check_consumed(
        [Rec(r.partition, r.key, r.value, r.headers, 0) for r in records],
        [replace(c, timestamp_ms=0) for c in consumed],
    )


def test_consume_from_offset(broker: BrokerProcess) -> None:
    """`-o N` starts at offset N of each partition (ListOffsets is not needed, Fetch is)."""
    topic = "kc-offset"
    create_topic(broker, topic, partitions=1)
    lines = b"".join(f"k{i}:v{i}\n".encode() for i in range(100))
    kcat(broker, "-P", "-t", topic, "-p", "0", "-K:", stdin=lines)
    out, _ = kcat(broker, "-C", "-t", topic, "-p", "0", "-e", "-o", "90", "-q", "-f", FORMAT)
    consumed = parse_consumed(out)
    assert [(c.offset, c.key, c.value) for c in consumed] == [
        (i, f"k{i}".encode(), f"v{i}".encode()) for i in range(90, 100)
    ]
    # a negative -o is relative to the end: needs ListOffsets(latest)
    out, _ = kcat(broker, "-C", "-t", topic, "-p", "0", "-e", "-o", "-5", "-q", "-f", FORMAT)
    assert [c.offset for c in parse_consumed(out)] == list(range(95, 100))
