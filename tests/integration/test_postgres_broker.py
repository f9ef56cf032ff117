"""The broker with its metadata in PostgreSQL (`--metadata postgresql://...`): produce and
consume with confluent-kafka; SIGKILL and restart lose no acknowledged record; a restart of
the PostgreSQL server while producing costs retries, not records."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.kafkaread import consume_all
from tests.pg import PgCluster

pytestmark = pytest.mark.integration

PARTITIONS = 3


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(10)


def assert_dense(stored: dict[tuple[int, int], bytes]) -> None:
    for p in range(PARTITIONS):  # no offset reused, none skipped
        offsets = sorted(o for (q, o) in stored if q == p)
        assert offsets == list(range(len(offsets)))


def test_sigkill_and_restart_keep_every_acknowledged_record(tmp_path: Path, pg_url: str) -> None:
    broker = BrokerProcess(data_dir=tmp_path / "data", extra_args=["--metadata", pg_url]).start()
    try:
        create_topic(broker.bootstrap, "pgdurable")
        acked: dict[tuple[int, int], bytes] = {}
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                errors.append(str(err))

        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                             "linger.ms": 2, "message.timeout.ms": 5000, "retries": 0})
        i = 0
        deadline = time.monotonic() + 60
        while len(acked) < 3000 and time.monotonic() < deadline:
            producer.produce("pgdurable", value=f"v{i}".encode(), partition=i % PARTITIONS,
                             on_delivery=on_delivery)
            i += 1
            producer.poll(0 if i % 500 else 0.01)
        assert len(acked) >= 3000, f"only {len(acked)} acks; errors {errors[:3]}"
        broker.kill()  # right after acks: no flush, no shutdown hook
        producer.flush(15)  # the rest fail: the broker is gone
        acked_before_kill = dict(acked)
        assert not (tmp_path / "data" / "meta.db").exists(), "metadata went to SQLite"

        broker.start()  # same objects directory, same database
        stored = consume_all(broker.bootstrap, "pgdurable", PARTITIONS)
        missing = [k for k in acked_before_kill if k not in stored]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
        assert all(stored[k] == v for k, v in acked_before_kill.items())
        assert_dense(stored)

        after: dict[tuple[int, int], bytes] = {}
        p2 = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for j in range(30):
            p2.produce("pgdurable", value=f"after{j}".encode(), partition=j % PARTITIONS,
                       on_delivery=lambda e, m: after.__setitem__(
                           (m.partition(), m.offset()), m.value()) if e is None else None)
        assert p2.flush(15) == 0 and len(after) == 30
        assert not set(after) & set(stored), "an offset was handed out twice"
        final = consume_all(broker.bootstrap, "pgdurable", PARTITIONS)
        assert final == {**stored, **after}
    finally:
        broker.stop()


def test_postgres_restart_while_producing_costs_retries_not_records(
    tmp_path: Path, pg_url: str, pg_cluster: PgCluster
) -> None:
    broker = BrokerProcess(data_dir=tmp_path / "data", extra_args=["--metadata", pg_url]).start()
    try:
        create_topic(broker.bootstrap, "pgrestart")
        acked: dict[tuple[int, int], bytes] = {}
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                errors.append(str(err))

        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5,
                             "message.timeout.ms": 60000, "retry.backoff.ms": 100})
        stop = threading.Event()
        sent = 0

        def produce() -> None:  # keeps appends in flight while the database goes away
            nonlocal sent
            while not stop.is_set():
                producer.produce("pgrestart", value=f"v{sent}".encode(),
                                 partition=sent % PARTITIONS, on_delivery=on_delivery)
                sent += 1
                producer.poll(0.002)

        thread = threading.Thread(target=produce)
        thread.start()
        try:
            time.sleep(1)
            pg_cluster.restart()
            time.sleep(1)
        finally:
            stop.set()
            thread.join()
        assert producer.flush(60) == 0
        assert not errors, errors[:3]
        assert len(acked) == sent
        stored = consume_all(broker.bootstrap, "pgrestart", PARTITIONS)
        assert stored == acked, "the log differs from what was acknowledged"
        assert_dense(stored)
        assert sorted(stored.values()) == sorted(acked.values())  # each value exactly once
    finally:
        broker.stop()
