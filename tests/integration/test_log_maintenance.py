"""Compaction into stream objects, retention and DeleteRecords, seen through real clients."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.integration.test_groups import produce, wait_for
from tests.kafkaread import consume_all

pytestmark = pytest.mark.integration

FAST_MAINTENANCE = [
    "--set", "compaction.interval.ms=300", "--set", "compaction.min.age.ms=0",
    "--set", "objects.gc.delay.ms=200", "--set", "log.retention.check.interval.ms=300",
]


def keys(root: Path, prefix: str) -> list[str]:
    base = root / prefix
    return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file()) \
        if base.exists() else []


def test_wal_objects_become_stream_objects_and_reads_still_see_everything(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(data_dir=tmp_path / "d", extra_args=FAST_MAINTENANCE).start()
    objects = tmp_path / "d" / "objects"
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("compacted", 3, 1)])["compacted"].result(10)
        produced = {}
        for round_ in range(5):  # several flushes, so several WAL objects
            produced.update(produce(broker.bootstrap, "compacted", round_ * 300, 300, 3))
        wait_for(lambda: keys(objects, "stream") and not keys(objects, "wal"), 30,
                 "every WAL object compacted and deleted")
        streams = keys(objects, "stream")
        assert {s.split("/")[1] for s in streams}.__len__() == 3  # one or more per partition
        stored = consume_all(broker.bootstrap, "compacted", 3)
        assert {k: v.decode() for k, v in stored.items()} == produced
        # new appends land in WAL objects again and are read together with stream objects
        produced.update(produce(broker.bootstrap, "compacted", 1500, 30, 3))
        broker.kill()
        broker.start()
        stored = consume_all(broker.bootstrap, "compacted", 3)
        assert {k: v.decode() for k, v in stored.items()} == produced
    finally:
        broker.stop()


def test_retention_and_delete_records_move_the_log_start(tmp_path: Path) -> None:
    broker = BrokerProcess(data_dir=tmp_path / "d", extra_args=FAST_MAINTENANCE).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("short", 1, 1, config={"retention.ms": "1500"}),
                             NewTopic("trimmed", 1, 1)])["short"].result(10)
        produce(broker.bootstrap, "short", 0, 100, 1)
        produce(broker.bootstrap, "trimmed", 0, 100, 1)
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w"})
        try:
            wait_for(lambda: c.get_watermark_offsets(TopicPartition("short", 0), 5) == (100, 100),
                     30, "retention to expire every record of 'short'")
            result = admin.delete_records([TopicPartition("trimmed", 0, 40)])
            low = next(iter(result.values())).result(10)
            assert low.low_watermark == 40
            assert c.get_watermark_offsets(TopicPartition("trimmed", 0), 5) == (40, 100)
        finally:
            c.close()
        # after a restart the log start stays where it was moved
        broker.kill()
        broker.start()
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w"})
        try:
            assert c.get_watermark_offsets(TopicPartition("trimmed", 0), 5) == (40, 100)
            assert c.get_watermark_offsets(TopicPartition("short", 0), 5) == (100, 100)
            c.assign([TopicPartition("trimmed", 0, 40)])
            deadline = time.monotonic() + 20
            first = None
            while first is None and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    first = m.offset()
            assert first == 40
        finally:
            c.close()
    finally:
        broker.stop()
