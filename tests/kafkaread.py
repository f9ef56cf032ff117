"""Reading a whole topic back with librdkafka, for tests that compare it with what was acked."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition


def consume_all(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "crash-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: dict[tuple[int, int], bytes] = {}
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                eof.add(m.partition())
                continue
            key = (m.partition(), m.offset())
            assert key not in got, f"offset {key} delivered twice"
            got[key] = m.value()
        assert len(eof) == partitions, "did not reach the end of every partition"
        return got
    finally:
        c.close()
