"""A librdkafka idempotent producer with five requests in flight per connection, while WAL
flushes fail (the S3 endpoint answers 503 longer than the object store retries).

What must survive: every acknowledged record is in the log exactly once, and each partition's
log holds the producer's records in the order they were sent (sequence order), across the
failed flushes and librdkafka's retries."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.faultproxy import S3FaultProxy
from tests.integration.test_s3_faults import BUCKET, proxied_s3  # noqa: F401  (fixture)
from tests.kafkaread import consume_all

pytestmark = pytest.mark.integration
PARTITIONS = 2


class Pipelining(threading.Thread):
    """Sends `<partition>:<n>` with n counting up per partition in small batches: while a
    flush fails (1-2 s of retries) up to five produce requests pile up on the connection."""

    def __init__(self, servers: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._servers, self._topic = servers, topic

    def run(self) -> None:
        def done(err: object, m: object) -> None:
            if err is None:
                self.acked[(m.partition(), m.offset())] = m.value()  # type: ignore[attr-defined]
            else:
                self.errors.append(str(err))

        p = Producer({"bootstrap.servers": self._servers, "enable.idempotence": True,
                      "max.in.flight.requests.per.connection": 5, "linger.ms": 1,
                      "batch.num.messages": 20, "message.timeout.ms": 120_000,
                      "retry.backoff.ms": 20})
        n = [0] * PARTITIONS
        while not self.stop.is_set():
            for part in range(PARTITIONS):
                for _ in range(10):
                    try:
                        p.produce(self._topic, f"{part}:{n[part]:08d}".encode(),
                                  partition=part, on_delivery=done)
                    except BufferError:
                        break
                    n[part] += 1
            p.poll(0.02)  # about 500 records/s per partition: a backlog that drains
        if p.flush(120):
            self.errors.append("not everything was delivered")


def test_pipelined_idempotent_producer_across_failed_flushes(
    tmp_path: Path, proxied_s3: S3FaultProxy  # noqa: F811
) -> None:
    url = (f"s3://{BUCKET}/log?endpoint={proxied_s3.endpoint}&region=us-east-1"
           "&timeout=3&read_timeout=2&connect_timeout=1")
    broker = BrokerProcess(data_dir=tmp_path / "d", extra_args=["--object-store", url]).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("seq", PARTITIONS, 1)])["seq"].result(10)
        prod = Pipelining(broker.bootstrap, "seq")
        prod.start()
        time.sleep(2)
        for _ in range(2):  # 503s for longer than the retry budget: flushes fail for good
            proxied_s3.set_mode("error")
            time.sleep(3)
            proxied_s3.set_mode("pass")
            time.sleep(2)
        prod.stop.set()
        prod.join(150)
        assert "WAL flush of" in broker.log(), "no flush failed: the test did not test anything"
        assert not prod.errors, prod.errors[:3]
        stored = consume_all(broker.bootstrap, "seq", PARTITIONS)
        lost = [k for k, v in prod.acked.items() if stored.get(k) != v]
        assert not lost, f"{len(lost)} acknowledged records lost or moved, e.g. {lost[:3]}"
        dupes = [v for v, c in Counter(stored.values()).items() if c > 1]
        assert not dupes, f"{len(dupes)} records written twice, e.g. {dupes[:3]}"
        for part in range(PARTITIONS):
            log = [stored[k] for k in sorted(k for k in stored if k[0] == part)]
            assert log == sorted(log), f"partition {part} is not in sequence order"
            assert log == [f"{part}:{i:08d}".encode() for i in range(len(log))], \
                f"partition {part}: a record is missing"
    finally:
        broker.stop()
