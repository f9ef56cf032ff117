"""Catch-up reads racing compaction: nothing is skipped, by consumers or by the table writer.

Compaction swaps a stream's WAL chunks for stream-object chunks (and the GC deletes the WAL
objects) while consumers read those chunks from the object store. What must survive: every
consumer sees every offset of every partition in order, with no gap and no repeat, and the
Iceberg table of the same topic holds every acknowledged offset exactly once. Run on the local
object store and on S3 (moto's server)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.integration.test_table_topic import keys_of, table_rows
from tests.s3server import broker_on_s3

pytestmark = pytest.mark.integration

PARTITIONS = 8
PRODUCE_SECONDS = 16.0

# compaction every 100 ms, WAL objects compacted at any age, replaced objects deleted
# soon after, small stream objects and chunks, and a cache too small to hold what is read, so
# catch-up reads go to the object store (and wait for it) while chunk lists are swapped
RACY = [
    "--set", "compaction.interval.ms=100", "--set", "compaction.min.age.ms=0",
    "--set", "objects.gc.delay.ms=100", "--set", "stream.object.max.bytes=131072",
    "--set", "stream.chunk.max.bytes=16384", "--set", "cache.max.bytes=0",
    "--set", "cache.readahead.bytes=16384",
]


@pytest.fixture(params=["file", "s3"])
def racing_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    args = list(RACY)
    env: dict[str, str] = {}
    if request.param == "s3":
        s3_args, env = broker_on_s3(request.getfixturevalue("s3_server"), "floe-race")
        args += s3_args
    b = BrokerProcess(data_dir=tmp_path / "data", extra_args=args, env=env).start()
    try:
        yield b
    finally:
        b.stop()


class Producing(threading.Thread):
    """An idempotent producer writing distinct values to every partition for `seconds`."""

    def __init__(self, bootstrap: str, topic: str, seconds: float) -> None:
        super().__init__(daemon=True)
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self._servers, self._topic, self._seconds = bootstrap, topic, seconds

    def run(self) -> None:
        def done(err: object, m: object) -> None:
            if err is None:
                self.acked[(m.partition(), m.offset())] = m.value()  # type: ignore[attr-defined]
            else:
                self.errors.append(str(err))

        p = Producer({"bootstrap.servers": self._servers, "enable.idempotence": True,
                      "linger.ms": 2, "message.timeout.ms": 60_000})
        end = time.monotonic() + self._seconds
        i = 0
        while time.monotonic() < end:
            for _ in range(40):
                p.produce(self._topic, f"value-{i:08d}-".encode() + b"x" * 150,
                          partition=i % PARTITIONS, on_delivery=done)
                i += 1
            p.poll(0.002)
        if p.flush(60):
            self.errors.append("not everything was delivered")


class CatchingUp(threading.Thread):
    """A librdkafka consumer assigned every partition from offset 0; notes each gap (an offset
    that is not the previous one + 1) and reads until `stop_at` is reached everywhere."""

    def __init__(self, bootstrap: str, topic: str, delay: float, min_bytes: int) -> None:
        super().__init__(daemon=True)
        self.gaps: list[tuple[int, int, int]] = []  # (partition, previous, got)
        self.last: dict[int, int] = {}
        self.stop_at: dict[int, int] | None = None  # set once production is over
        self.errors: list[str] = []
        self._delay = delay
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"catch-up-{delay}",
                            "enable.auto.commit": False, "fetch.min.bytes": min_bytes,
                            "fetch.wait.max.ms": 100})
        self._topic = topic

    def done(self) -> bool:
        stop = self.stop_at
        return stop is not None and all(self.last.get(p, -1) + 1 >= n for p, n in stop.items())

    def run(self) -> None:
        time.sleep(self._delay)  # start behind the producer: catch up through old chunks
        self._c.assign([TopicPartition(self._topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 50
        try:
            while not self.done() and time.monotonic() < deadline:
                m = self._c.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(m.error()))
                    continue
                p, off = m.partition(), m.offset()
                prev = self.last.get(p, -1)
                if off != prev + 1:
                    self.gaps.append((p, prev, off))
                self.last[p] = max(prev, off)
        finally:
            self._c.close()


def test_catch_up_reads_racing_compaction_skip_nothing(racing_broker: BrokerProcess) -> None:
    b = racing_broker
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    cfg = {"table.topic.enable": "true", "table.topic.convert.value.type": "string",
           "table.topic.commit.interval.ms": "1000"}
    admin.create_topics([NewTopic("race", PARTITIONS, 1, config=cfg)])["race"].result(10)
    producer = Producing(b.bootstrap, "race", PRODUCE_SECONDS)
    consumers = [CatchingUp(b.bootstrap, "race", 3.0, 64 * 1024),
                 CatchingUp(b.bootstrap, "race", 6.0, 256 * 1024)]
    producer.start()
    for c in consumers:
        c.start()
    producer.join(PRODUCE_SECONDS + 65)
    assert not producer.errors, producer.errors[:3]
    acked = producer.acked
    ends = Counter(p for p, _ in acked)
    assert sorted(acked) == sorted((p, o) for p in ends for o in range(ends[p])), \
        "acknowledged offsets are not 0..n-1 in every partition"
    for c in consumers:
        c.stop_at = dict(ends)
    for c in consumers:
        c.join(55)
    for c in consumers:
        assert not c.errors, c.errors[:3]
        assert not c.gaps, f"{len(c.gaps)} gaps (partition, previous, next): {c.gaps[:5]}"
        assert c.done(), f"consumer stopped at {c.last}, the log ends at {dict(ends)}"
    deadline = time.monotonic() + 20
    rows = table_rows(b.data_dir, "race")
    while len(rows) < len(acked) and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = table_rows(b.data_dir, "race")
    keys = keys_of(rows)
    assert set(keys) == set(acked), \
        f"table holds {len(keys)} of {len(acked)} offsets, missing e.g. " \
        f"{sorted(set(acked) - set(keys))[:5]}"
    assert max(keys.values()) == 1, "an offset is in the table twice"
    assert "compacted" in b.log(), "compaction never ran"
