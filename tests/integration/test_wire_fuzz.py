"""Wire fuzz: thousands of mutated frames, taken from real clients' requests, against a broker.

Capture: every client available here (confluent-kafka, aiokafka, kafka-python, the Java client
if its jar is present, kcat) runs a short session through a recording TCP proxy in front of a
real broker (tests/wirecapture.py): admin APIs, Produce with gzip/snappy/lz4/zstd batches,
idempotence, a consumer group, Fetch, ListOffsets; flexible and old API versions.

Fuzz: frames mutated as tests/wirefuzz.py describes go to a second broker (file and S3), one to
three per fresh connection, 16 connections at a time. What must survive: the broker process;
a healthy librdkafka producer and consumer on their own connections, which keep producing and
consuming during the run and get back exactly what was acknowledged; the broker's memory
(peak RSS, VmHWM, stays within RSS_GROWTH_BOUND of where it started, and its address space
is capped so that no single reservation of gigabytes can succeed unnoticed); the log (one
line per closed connection, no traceback).

Reproduce: the seed is printed (and in every failure message). A live capture differs from
run to run (timestamps, ids, a heartbeat more or less), so a failed run writes its captured
frames to a file: `FLOE_FUZZ_SEED=N FLOE_FUZZ_CAPTURE=FILE pytest
tests/integration/test_wire_fuzz.py` then sends exactly the same frames again. It also writes
the frames of its last connections to a file that `FLOE_FUZZ_REPLAY=FILE` sends alone.
`FLOE_FUZZ_FRAMES=N` changes the number of frames (default 5000).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import resource
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.protocol.codec import decode_request
from broker.protocol.records import iter_headers
from tests.brokerproc import BrokerProcess, running_broker
from tests.integration.test_bad_input import api_versions, create_topic
from tests.rawclient import RawClient
from tests.wirecapture import RecordingProxy, workloads
from tests.wirefuzz import Mutated, Mutator, Outcomes, batches, send_one_connection

pytestmark = [
    pytest.mark.integration,
    # kafka-python reads its protocol schemas through a deprecated importlib API
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

N_FRAMES = int(os.environ.get("FLOE_FUZZ_FRAMES", "5000"))
CONCURRENCY = 16
MAX_PER_CONNECTION = 3
WAIT_S = 0.5
# In flight at once: 16 connections x 3 frames of a few KiB (the largest captured frame is
# ~1 KiB; extensions add <= 4 KiB): well under 1 MiB of requests. Measured peak growth over
# 5,000-50,000 frames: 15-40 MiB (allocator caches, group and topic state, the healthy
# client's records). 256 MiB leaves room for that and is far below what one length-driven
# allocation (gigabytes) or a decompression bomb (capped at 256 MiB) plus that would take.
RSS_GROWTH_BOUND = 256 << 20
ADDRESS_SPACE_HEADROOM = 4 << 30
REQUIRED_APIS = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 16: "ListGroups", 18: "ApiVersions",
    19: "CreateTopics", 20: "DeleteTopics", 22: "InitProducerId", 32: "DescribeConfigs",
    37: "CreatePartitions",
}


def save_frames(path: Path, frames: list[bytes]) -> None:
    path.write_bytes(b"".join(struct.pack(">i", len(f)) + f for f in frames))


def load_frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    frames, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        frames.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return frames


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Request frames of every available client, recorded live through a proxy (or, with
    FLOE_FUZZ_CAPTURE=FILE naming a file a failed run wrote, the frames of that run)."""
    again = os.environ.get("FLOE_FUZZ_CAPTURE")
    if again:
        return load_frames(Path(again))
    proxy = RecordingProxy()
    data = tmp_path_factory.mktemp("capture") / "floe-data"
    failures: dict[str, str] = {}
    with running_broker(data, "--advertised", proxy.address,
                        "--set", "group.initial.rebalance.delay.ms=0") as b:
        proxy.start(b.bootstrap)
        try:
            for name, workload in workloads().items():
                for attempt in range(2):  # one retry: the clients share 2 cores with others
                    try:
                        workload(proxy.address, f"cap{attempt}")
                        failures.pop(name, None)
                        break
                    except Exception as e:  # reported below
                        failures[name] = repr(e)[-2000:]
        finally:
            proxy.stop()
        assert not failures, f"{failures}\n{b.log()[-3000:]}"
    frames = proxy.taken()
    apis = {struct.unpack_from(">h", f)[0] for f in frames}
    missing = {k: v for k, v in REQUIRED_APIS.items() if k not in apis}
    assert not missing, f"no {missing} captured"
    codecs = produced_codecs(frames)
    assert {1, 2, 3, 4} <= codecs, f"compressed batches captured: {codecs}"
    flexible = {struct.unpack_from(">hh", f) for f in frames}
    assert (3, 12) in flexible and any(k == 3 and v < 9 for k, v in flexible)
    return frames


def produced_codecs(frames: list[bytes]) -> set[int]:
    out = set()
    for f in frames:
        if struct.unpack_from(">h", f)[0] != 0:
            continue
        _head, req = decode_request(f, (0, 20))
        for t in req.topic_data:
            for p in t.partition_data:
                out |= {h.compression for h in iter_headers(bytes(p.records or b""))}
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, VmSize... of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0]) * 1024
    return out


class HealthyClient:
    """A librdkafka producer (acks=all) and a consumer on their own connections: keeps
    producing one record every 10 ms and consuming them until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "linger.ms": 1, "enable.idempotence": True})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "healthy",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 50})
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.delivered: list[bytes] = []
        self.errors: list[str] = []
        self.unflushed = -1  # records still unacknowledged after the final flush
        self.consumed: list[bytes] = []
        self._stop = threading.Event()
        self._produced = threading.Event()
        self._drain_deadline = float("inf")
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered.append(msg.value())

    def _produce(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.producer.produce(self.topic, value=f"healthy-{i}".encode(),
                                  on_delivery=self._on_delivery)
            self.producer.poll(0.01)
            i += 1
        self.unflushed = self.producer.flush(30)

    def _consume(self) -> None:
        while True:
            if self._produced.is_set() and len(self.consumed) >= len(self.delivered):
                return
            if time.monotonic() > self._drain_deadline:
                return
            m = self.consumer.poll(0.1)
            if m is not None and m.error() is None:
                self.consumed.append(m.value())

    def start(self) -> HealthyClient:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stop producing, wait for every delivery report, let the consumer catch up."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._threads[0].join(40)
        self._drain_deadline = time.monotonic() + 20
        self._produced.set()
        self._threads[1].join(40)
        self.consumer.close()


def _served(broker: BrokerProcess) -> dict[int, tuple[int, int]]:
    with RawClient(broker.bootstrap) as c:
        resp: Any = api_versions(c)
        return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


async def _fuzz(address: tuple[str, int], todo: Iterator[list[Mutated]], broker: BrokerProcess,
                recent: collections.deque[list[Mutated]], out: Outcomes) -> None:
    async def worker() -> None:
        for batch in todo:
            recent.append(batch)
            try:
                await send_one_connection(address, batch, WAIT_S, out)
            except OSError as e:
                raise AssertionError(f"broker gone ({_exit(broker)}): {e!r}") from e
            if out.connections % 50 == 0:
                assert broker.proc is not None and broker.proc.poll() is None, _exit(broker)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def _exit(broker: BrokerProcess) -> str:
    code = broker.proc.poll() if broker.proc is not None else None
    return "still running" if code is None else f"broker died, exit status {code}"


def _dump(path: Path, recent: collections.deque[list[Mutated]]) -> None:
    with path.open("w") as f:
        for i, batch in enumerate(recent):
            for m in batch:
                f.write(f"{i}\t{m.wire.hex()}\t{m.what}\n")


def _replay(path: Path) -> Iterator[list[Mutated]]:
    by_conn: dict[str, list[Mutated]] = {}
    for line in path.read_text().splitlines():
        conn, wire, what = line.split("\t", 2)
        by_conn.setdefault(conn, []).append(Mutated(bytes.fromhex(wire), what))
    yield from by_conn.values()


def test_wire_fuzz(broker: BrokerProcess, captured: list[bytes], tmp_path: Path) -> None:
    seed = int(os.environ.get("FLOE_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
    print(f"FLOE_FUZZ_SEED={seed} ({len(captured)} captured frames, {N_FRAMES} to send)")
    assert broker.proc is not None
    pid = broker.proc.pid
    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "healthy-fuzz-bystander").error_code == 0
    served = _served(broker)
    healthy = HealthyClient(broker.bootstrap, "healthy-fuzz-bystander").start()
    deadline = time.monotonic() + 30
    while len(healthy.consumed) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(healthy.consumed) >= 20, (healthy.errors, broker.log()[-3000:])
    before = proc_status(pid)
    limit = before["VmSize"] + ADDRESS_SPACE_HEADROOM
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    delivered_before = len(healthy.delivered)

    replay = os.environ.get("FLOE_FUZZ_REPLAY")
    mutator = Mutator(captured, served, random.Random(seed))
    todo = _replay(Path(replay)) if replay else batches(mutator, N_FRAMES, MAX_PER_CONNECTION)
    recent: collections.deque[list[Mutated]] = collections.deque(maxlen=4 * CONCURRENCY)
    out = Outcomes()
    host, port = broker.bootstrap.rsplit(":", 1)
    started = time.monotonic()
    dump = tmp_path / "fuzz-last-frames.tsv"
    capture_file = tmp_path / "captured-frames.bin"
    try:
        asyncio.run(_fuzz((host, int(port)), todo, broker, recent, out))
        took = time.monotonic() - started
        alive = broker.proc is not None and broker.proc.poll() is None
        assert alive, _exit(broker)
        after = proc_status(pid)
        delivered_during = len(healthy.delivered) - delivered_before
        healthy.stop()
        print(f"fuzz seed {seed}: {out.frames} frames on {out.connections} connections in"
              f" {took:.1f}s: answered {out.answered}, closed {out.closed}, waited"
              f" {out.waited}; RSS {before['VmRSS'] >> 20} -> {after['VmRSS'] >> 20} MiB,"
              f" peak {after['VmHWM'] >> 20} MiB; healthy client delivered {delivered_during}"
              " during the run")
        assert after["VmHWM"] - before["VmRSS"] < RSS_GROWTH_BOUND, after
        assert delivered_during >= 20, "the healthy producer stalled during the fuzz run"
        assert not healthy.errors, healthy.errors[:5]
        assert healthy.unflushed == 0, f"{healthy.unflushed} records never acknowledged"
        assert healthy.consumed == healthy.delivered, (
            f"consumed {len(healthy.consumed)}, delivered {len(healthy.delivered)}")
        with RawClient(broker.bootstrap) as c:
            assert api_versions(c).error_code == 0  # and still serving new connections
        log = broker.log()
        assert "Traceback" not in log, log[log.index("Traceback") - 2000 :][:6000]
        closing = log.count("closing connection from")
        assert out.closed <= closing <= out.connections, (closing, out)
    except BaseException as e:
        _dump(dump, recent)
        save_frames(capture_file, captured)
        raise AssertionError(
            f"FLOE_FUZZ_SEED={seed}: {e!r}\nthe same run again: FLOE_FUZZ_SEED={seed}"
            f" FLOE_FUZZ_CAPTURE={capture_file}; only the frames of the last {len(recent)}"
            f" connections: FLOE_FUZZ_REPLAY={dump}\n"
            f"--- broker log ---\n{broker.log()[-4000:]}"
        ) from e
    finally:
        healthy.stop()
