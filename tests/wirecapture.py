"""Capture the request frames real Kafka clients send, for the wire fuzz test.

`RecordingProxy` forwards connections to a broker unchanged and keeps a copy of every request
frame (without its size prefix). Start the broker with `--advertised` set to the proxy's
address, so clients that follow Metadata come back through the proxy too. The `*_workload`
functions each drive one client library through a short but broad session: admin APIs, Produce
with every compression codec (and idempotence), a consumer group (FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, OffsetCommit, OffsetFetch, LeaveGroup), Fetch and ListOffsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import struct
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from tests.threadedserver import ThreadedServer

CODECS = ("gzip", "snappy", "lz4", "zstd")
N_PER_CODEC = 30
WORKLOAD_TIMEOUT_S = 30.0
REPO_ROOT = Path(__file__).resolve().parents[1]
JAVA_PROGRAM = REPO_ROOT / "tests" / "integration" / "java" / "FloeClientCheck.java"


class RecordingProxy(ThreadedServer):
    """A transparent TCP proxy that records request frames while `recording` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.upstream: tuple[str, int] = ("127.0.0.1", 0)
        self.frames: list[bytes] = []
        self.recording = True
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, upstream: str) -> RecordingProxy:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.start_server()
        return self

    def stop(self) -> None:
        self.stop_server()

    def taken(self) -> list[bytes]:
        with self._lock:
            return list(self.frames)

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            cw.close()
            return
        tasks = [asyncio.ensure_future(self._requests(cr, uw)),
                 asyncio.ensure_future(self._responses(ur, cw))]
        try:
            with contextlib.suppress(asyncio.CancelledError):  # the proxy is stopping
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (cw, uw):
                w.close()
                # cancelled when the proxy stops: end quietly (asyncio logs a handler's error)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await w.wait_closed()

    async def _requests(self, cr: asyncio.StreamReader, uw: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await cr.readexactly(4)
                frame = await cr.readexactly(struct.unpack(">i", head)[0])
                if self.recording:
                    with self._lock:
                        self.frames.append(frame)
                uw.write(head + frame)
                await uw.drain()

    async def _responses(self, ur: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await ur.read(1 << 16):
                cw.write(data)
                await cw.drain()


def _records(tag: str) -> list[tuple[bytes, bytes]]:
    return [(f"{tag}-k{i}".encode(), f"{tag}-value-{i}-".encode() * 8) for i in range(N_PER_CODEC)]


def confluent_workload(bootstrap: str, prefix: str) -> None:
    """librdkafka via confluent-kafka: admin, four codecs (zstd idempotent), a group."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    topic, scratch = f"{prefix}-ck", f"{prefix}-ck-scratch"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "3600000"}),
                                  NewTopic(scratch, 1, 1)]).values():
        f.result(WORKLOAD_TIMEOUT_S)
    for f in admin.describe_configs([ConfigResource("topic", topic)]).values():
        f.result(WORKLOAD_TIMEOUT_S)
    for f in admin.create_partitions([NewPartitions(topic, 3)]).values():
        f.result(WORKLOAD_TIMEOUT_S)
    for codec in CODECS:
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                      "linger.ms": 5, "enable.idempotence": codec == "zstd"})
        for k, v in _records(codec):
            p.produce(topic, key=k, value=v, headers=[("h", b"v")])
        assert p.flush(WORKLOAD_TIMEOUT_S) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-ck-group",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "heartbeat.interval.ms": 100, "session.timeout.ms": 6000})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + WORKLOAD_TIMEOUT_S
    while got < N_PER_CODEC * len(CODECS) and time.monotonic() < deadline:
        got += sum(1 for m in c.consume(100, 0.5) if m.error() is None)
    time.sleep(0.5)  # a few heartbeats
    c.commit(asynchronous=False)
    c.committed([TopicPartition(topic, 0)], WORKLOAD_TIMEOUT_S)
    c.offsets_for_times([TopicPartition(topic, 0, 1)], WORKLOAD_TIMEOUT_S)
    c.close()
    assert got == N_PER_CODEC * len(CODECS), got
    admin.list_consumer_groups().result(WORKLOAD_TIMEOUT_S)
    for f in admin.describe_consumer_groups([f"{prefix}-ck-group"]).values():
        f.result(WORKLOAD_TIMEOUT_S)
    for f in admin.delete_topics([scratch]).values():
        f.result(WORKLOAD_TIMEOUT_S)


async def _aiokafka_workload(bootstrap: str, prefix: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    topic = f"{prefix}-aio"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
        await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        for codec in CODECS:
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec,
                                 linger_ms=5, enable_idempotence=codec == "lz4")
            await p.start()
            try:
                await asyncio.gather(*[await p.send(topic, v, key=k) for k, v in _records(codec)])
            finally:
                await p.stop()
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"{prefix}-aio-group",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             heartbeat_interval_ms=100)
        await c.start()
        try:
            got = 0
            deadline = time.monotonic() + WORKLOAD_TIMEOUT_S
            while got < N_PER_CODEC * len(CODECS) and time.monotonic() < deadline:
                batches = await c.getmany(timeout_ms=500)
                got += sum(len(b) for b in batches.values())
            await asyncio.sleep(0.5)
            await c.commit()
            assert got == N_PER_CODEC * len(CODECS), got
        finally:
            await c.stop()
        await admin.list_consumer_groups()
        await admin.delete_topics([topic])
    finally:
        await admin.close()


def aiokafka_workload(bootstrap: str, prefix: str) -> None:
    """aiokafka: admin, four codecs (lz4 idempotent), a group, delete the topic."""
    asyncio.run(_aiokafka_workload(bootstrap, prefix))


def kafka_python_workload(bootstrap: str, prefix: str) -> None:
    """kafka-python (older and non-flexible API versions): admin, four codecs, a group."""
    with warnings.catch_warnings():  # kafka-python reads its schemas with a deprecated API
        warnings.filterwarnings("ignore", "open_text is deprecated", DeprecationWarning)
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
        from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

    topic = f"{prefix}-kp"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])
        admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        for codec in CODECS:
            p = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=5)
            for k, v in _records(codec):
                p.send(topic, v, key=k)
            p.flush(WORKLOAD_TIMEOUT_S)
            p.close()
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"{prefix}-kp-group",
                          auto_offset_reset="earliest", enable_auto_commit=False,
                          heartbeat_interval_ms=100,
                          consumer_timeout_ms=int(WORKLOAD_TIMEOUT_S * 1000))
        got = 0
        deadline = time.monotonic() + WORKLOAD_TIMEOUT_S
        while got < N_PER_CODEC * len(CODECS) and time.monotonic() < deadline:
            got += sum(len(b) for b in c.poll(500).values())
        c.commit()
        c.close()
        assert got == N_PER_CODEC * len(CODECS), got
        admin.list_groups()
        admin.describe_groups([f"{prefix}-kp-group"])
        admin.list_group_offsets(f"{prefix}-kp-group")
    finally:
        admin.close()


def java_classpath() -> str | None:
    cp = os.environ.get("FLOE_JAVA_CLASSPATH") or str(REPO_ROOT / ".cache" / "java" / "lib" / "*")
    jar_dir = Path(cp.split(os.pathsep)[0].rstrip("*"))
    if shutil.which("java") is None or not list(jar_dir.glob("kafka-clients*.jar")):
        return None
    return cp


def java_workload(bootstrap: str, prefix: str) -> None:
    """The official Java client (if its jar is there): admin and a round trip per codec."""
    cp = java_classpath()
    assert cp is not None
    java = shutil.which("java")
    assert java is not None
    for args in (["roundtrip-all", "20", f"{prefix}-java", *CODECS], ["admin", f"{prefix}-jadm"]):
        proc = subprocess.run([java, "-cp", cp, str(JAVA_PROGRAM), bootstrap, *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]


def kcat_workload(bootstrap: str, prefix: str) -> None:
    """kcat (Debian's, on an older librdkafka: other API versions)."""
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat is not None
    subprocess.run([kcat, "-b", bootstrap, "-L"], capture_output=True, timeout=30, check=True)
    subprocess.run([kcat, "-b", bootstrap, "-t", f"{prefix}-kcat", "-P", "-z", "snappy"],
                   input=b"one\ntwo\n", capture_output=True, timeout=30, check=True)
    subprocess.run([kcat, "-b", bootstrap, "-t", f"{prefix}-kcat", "-C", "-e", "-o",
                    "beginning"], capture_output=True, timeout=30, check=True)


def workloads() -> dict[str, Callable[[str, str], None]]:
    """Every client available here, by name."""
    out: dict[str, Callable[[str, str], None]] = {
        "confluent-kafka": confluent_workload,
        "aiokafka": aiokafka_workload,
        "kafka-python": kafka_python_workload,
    }
    if java_classpath() is not None:
        out["java"] = java_workload
    if shutil.which("kcat") or shutil.which("kafkacat"):
        out["kcat"] = kcat_workload
    return out
