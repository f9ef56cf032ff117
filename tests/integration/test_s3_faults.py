"""Object-store faults under a live producer: 503 SlowDown, 500s, stalls longer than the flush
interval and the S3 timeouts, and SIGKILLs while WAL objects are being compacted; a stall
under a producer far faster than the store holds the producer back instead of the broker
buffering all it is sent.

What must survive: every acknowledged record, at the offset it was acknowledged with; no offset
holds two records; with an idempotent producer no record is written twice. Produces during a
fault are delayed or answered with a retriable error, never acknowledged without durability."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.faultproxy import S3FaultProxy
from tests.kafkaread import consume_all
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV, bucket_listing, moto_s3

pytestmark = pytest.mark.integration
BUCKET = "faults"


@pytest.fixture
def proxied_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3FaultProxy]:
    for k, v in TEST_AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in UNSET_AWS_ENV:
        monkeypatch.delenv(k, raising=False)
    with moto_s3() as endpoint:
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        c.create_bucket(Bucket=BUCKET)
        c.close()
        u = urlparse(endpoint)
        assert u.hostname is not None and u.port is not None
        with S3FaultProxy((u.hostname, u.port)) as proxy:
            yield proxy


class SteadyProducer:
    """An idempotent producer sending distinct values in a background thread."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, tag: str = "r", size: int = 0
    ) -> None:
        self.tag = tag
        self.size = size  # values padded to this many bytes
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )
        self._t = threading.Thread(target=self._run, args=(topic, partitions), daemon=True)

    def _run(self, topic: str, partitions: int) -> None:
        def done(err: object, m: object) -> None:
            if err is None:
                self.acked[(m.partition(), m.offset())] = m.value()  # type: ignore[attr-defined]
            else:
                self.errors.append(str(err))

        while not self._stop.is_set():
            for _ in range(50):
                try:
                    self._p.produce(
                        topic,
                        f"{self.tag}{self.sent}".encode().ljust(self.size, b"."),
                        partition=self.sent % partitions,
                        on_delivery=done,
                    )
                    self.sent += 1
                except BufferError:
                    break
            self._p.poll(0.01)

    def __enter__(self) -> SteadyProducer:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(10)
        self._p.flush(120)


def check(bootstrap: str, topic: str, partitions: int, acked: dict[tuple[int, int], bytes]) -> None:
    stored = consume_all(bootstrap, topic, partitions)
    lost = [k for k in acked if stored.get(k) != acked[k]]
    assert not lost, f"{len(lost)} acknowledged records lost or changed, e.g. {lost[:3]}"
    dupes = [v for v, n in Counter(stored.values()).items() if n > 1]
    assert not dupes, f"records written twice: {dupes[:3]}"
    for p in range(partitions):
        offsets = sorted(o for q, o in stored if q == p)
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not dense"


def test_slowdown_errors_and_stalls_lose_and_duplicate_nothing(
    tmp_path: Path, proxied_s3: S3FaultProxy
) -> None:
    url = (
        f"s3://{BUCKET}/log?endpoint={proxied_s3.endpoint}&region=us-east-1"
        "&timeout=3&read_timeout=2&connect_timeout=1"
    )
    broker = BrokerProcess(data_dir=tmp_path / "d", extra_args=["--object-store", url]).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("faulty", 3, 1)])["faulty"].result(10)
        with SteadyProducer(broker.bootstrap, "faulty", 3) as prod:
            time.sleep(2)
            before = len(prod.acked)
            for mode, status, seconds in [
                ("error", (503, "SlowDown"), 3),
                ("stall", (0, ""), 6),
                ("error", (500, "InternalError"), 2),
            ]:
                proxied_s3.set_mode(mode, status)
                time.sleep(0.5)  # flushes in flight when the fault began may still land
                frozen = len(prod.acked)
                time.sleep(seconds)
                # nothing can become durable while the store fails: no new acks
                assert len(prod.acked) == frozen, f"acks while the object store was {mode}"
                proxied_s3.set_mode("pass")
                time.sleep(3)
            assert len(prod.acked) > before
        assert proxied_s3.requests_failed > 0
        check(broker.bootstrap, "faulty", 3, prod.acked)
        assert not prod.errors, prod.errors[:3]  # librdkafka retried through every fault
        broker.kill()  # and it is all in the bucket
        broker.start()
        check(broker.bootstrap, "faulty", 3, prod.acked)
    finally:
        broker.stop()


def test_a_stalled_store_holds_producers_back_with_bounded_memory(
    tmp_path: Path, proxied_s3: S3FaultProxy
) -> None:
    """While the store stalls, the broker holds at most (wal.max.inflight.flushes + 1) x
    wal.flush.max.bytes of produced data not yet durable, plus the requests it is reading
    (a producer with 4 KiB records waits: its Produce requests stay unanswered); nothing
    is acknowledged meanwhile, and once the store answers again every record is, none lost
    or written twice."""
    from tests.integration.test_metrics import scrape, total

    url = (
        f"s3://{BUCKET}/bp?endpoint={proxied_s3.endpoint}&region=us-east-1"
        "&timeout=3&read_timeout=2&connect_timeout=1"
    )
    limit = 2 * 256 * 1024
    args = ["--object-store", url, "--set", "wal.flush.max.bytes=262144",
            "--set", "wal.max.inflight.flushes=1"]
    broker = BrokerProcess(data_dir=tmp_path / "d", extra_args=args).start()
    try:
        admin_address = broker.admin_address()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("pressed", 3, 1)])["pressed"].result(10)
        with SteadyProducer(broker.bootstrap, "pressed", 3, size=4096) as prod:
            time.sleep(1)
            proxied_s3.set_mode("stall")
            time.sleep(0.5)  # flushes in flight when the fault began may still land
            frozen = len(prod.acked)
            held: list[float] = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                held.append(total(scrape(admin_address), "floe_wal_unflushed_bytes"))
                time.sleep(0.1)
            assert len(prod.acked) == frozen, "acks while the object store stalled"
            waits = total(scrape(admin_address), "floe_produce_room_waits_total")
            proxied_s3.set_mode("pass")
            time.sleep(2)
        # a Produce request of librdkafka holds at most message.max.bytes (1,000,000)
        assert max(held) <= limit + 1_000_000, f"held {max(held):.0f} bytes (limit {limit})"
        assert max(held) >= limit / 2, held  # the producer did push against it
        assert waits > 0
        assert len(prod.acked) > frozen and not prod.errors, prod.errors[:3]
        check(broker.bootstrap, "pressed", 3, prod.acked)
    finally:
        broker.stop()


def test_sigkill_during_compaction(tmp_path: Path, proxied_s3: S3FaultProxy) -> None:
    url = f"s3://{BUCKET}/c?endpoint={proxied_s3.endpoint}&region=us-east-1"
    args = [
        "--object-store",
        url,
        "--set",
        "compaction.interval.ms=100",
        "--set",
        "compaction.min.age.ms=0",
        "--set",
        "objects.gc.delay.ms=0",
    ]
    broker = BrokerProcess(data_dir=tmp_path / "d", extra_args=args).start()
    acked: dict[tuple[int, int], bytes] = {}
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("churn", 2, 1)])["churn"].result(10)
        for round_ in range(4):
            with SteadyProducer(broker.bootstrap, "churn", 2, tag=f"round{round_}-") as prod:
                time.sleep(1.0 + 0.37 * round_)
            acked.update(prod.acked)
            broker.kill()  # compaction runs every 100 ms: somewhere in a run, likely
            broker.start()
            check(broker.bootstrap, "churn", 2, acked)
        keys = bucket_listing(proxied_s3.endpoint, BUCKET, "c/")
        assert any(k.startswith("c/stream/") for k in keys), "compaction never ran"
    finally:
        broker.stop()
