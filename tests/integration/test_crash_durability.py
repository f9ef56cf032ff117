"""Acknowledged means durable: SIGKILL the broker mid-stream, restart it on the same data
directory, and every acknowledged record is there at the offset it was acknowledged with."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.kafkaread import consume_all

pytestmark = pytest.mark.integration


def test_sigkill_after_acks_all_loses_nothing(tmp_path: Path) -> None:
    broker = BrokerProcess(data_dir=tmp_path / "data").start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("durable", 3, 1)])["durable"].result(10)
        acked: dict[tuple[int, int], bytes] = {}
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                errors.append(str(err))

        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 5000,
                "retries": 0,
                "reconnect.backoff.max.ms": 200,
            }
        )
        i = 0
        killed = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            producer.produce(
                "durable", value=f"v{i}".encode(), partition=i % 3, on_delivery=on_delivery
            )
            i += 1
            producer.poll(0)
            if not killed and len(acked) >= 5000:
                broker.kill()  # right after acks: no flush, no shutdown hook
                killed = True
                break
            if i % 1000 == 0:
                producer.poll(0.01)
        assert killed, f"only {len(acked)} acks before the deadline; errors {errors[:3]}"
        producer.flush(15)  # the rest fail: the broker is gone
        acked_before_kill = dict(acked)

        broker.start()  # same data directory, same port
        stored = consume_all(broker.bootstrap, "durable", 3)
        missing = [k for k in acked_before_kill if k not in stored]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
        wrong = [k for k, v in acked_before_kill.items() if stored[k] != v]
        assert not wrong, f"records at {wrong[:5]} changed"
        for p in range(3):  # offsets stay dense per partition: none reused, none skipped
            offsets = sorted(o for (q, o) in stored if q == p)
            assert offsets == list(range(len(offsets)))

        # the restarted broker goes on from the durable end, never reusing an offset
        after: dict[tuple[int, int], bytes] = {}
        p2 = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for j in range(30):
            p2.produce(
                "durable",
                value=f"after{j}".encode(),
                partition=j % 3,
                on_delivery=lambda e, m: (
                    after.__setitem__((m.partition(), m.offset()), m.value()) if e is None else None
                ),
            )
        assert p2.flush(15) == 0
        assert len(after) == 30
        assert not set(after) & set(stored)
        final = consume_all(broker.bootstrap, "durable", 3)
        assert all(final[k] == v for k, v in {**acked_before_kill, **after}.items())
    finally:
        broker.stop()
