"""`floe broker --object-store null://`: the same front end on the null storage engine, as the
benchmarks use it for their protocol ceiling. A real client (librdkafka) creates a topic,
produces with acks=all and idempotence, sees offsets advance (delivery reports, watermarks,
ListOffsets) and reads back no record; nothing is written to the data directory's objects."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import running_broker

pytestmark = pytest.mark.integration


def test_null_engine_acknowledges_counts_and_stores_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "floe-data"
    with running_broker(data_dir, "--object-store", "null://") as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.create_topics([NewTopic("n", num_partitions=2)]).values():
            f.result(10)
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                      "enable.idempotence": True, "linger.ms": 5})
        offsets: list[tuple[int, int]] = []

        def report(err: object, msg: object) -> None:
            assert err is None, err
            offsets.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

        for i in range(30):
            p.produce("n", value=b"x" * 100, partition=i % 2, on_delivery=report)
            if i == 14:
                p.flush(10)  # two requests per partition: offsets continue across them
        assert p.flush(10) == 0
        for part in (0, 1):
            assert sorted(o for q, o in offsets if q == part) == list(range(15))
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        try:
            assert c.get_watermark_offsets(TopicPartition("n", 0), 10) == (0, 15)
            earliest = c.offsets_for_times([TopicPartition("n", 1, -2)], 10)
            assert earliest[0].offset == 0
            c.assign([TopicPartition("n", 0, 0)])
            assert c.consume(10, 1.0) == []  # no record bytes were kept
            c.commit(offsets=[TopicPartition("n", 0, 7)], asynchronous=False)
            assert c.committed([TopicPartition("n", 0)], 10)[0].offset == 7
        finally:
            c.close()
    assert not (data_dir / "objects").exists()
