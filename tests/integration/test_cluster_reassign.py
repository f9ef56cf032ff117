"""Partition reassignment (AlterPartitionReassignments / ListPartitionReassignments, issue 12)
on a 3-broker cluster, driven by kafka-python's KafkaAdminClient (confluent-kafka 2.16 has no
reassignment API): a partition pinned to another broker moves there while an idempotent
acks=all producer and a consumer run (nothing lost, nothing twice), stays there, is listed as
ongoing while its target is down (and `floe cluster status` shows the pin) and comes back to
it when it returns; a cancel; the documented refusals. Real `floe broker` processes
(tests/integration/test_cluster.py)."""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.test_cluster import (
    TIMEOUT_S,
    cluster,
    create_topic,
    leaders,
    node,
    wait_for,
)
from tests.integration.test_cluster_groups import floe
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)

# kafka-python 3.0 loads its protocol schemas with importlib.resources.read_text (deprecated;
# see test_kafka_python.py)
_KAFKA_SCHEMA_WARNING = "open_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", _KAFKA_SCHEMA_WARNING, DeprecationWarning)
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import (
        InvalidReplicationAssignmentError,
        KafkaConnectionError,
        NoReassignmentInProgressError,
        UnknownTopicOrPartitionError,
    )

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.filterwarnings(f"ignore:{_KAFKA_SCHEMA_WARNING}:DeprecationWarning"),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def kafka_admin() -> Iterator[Callable[[str], KafkaAdminClient]]:
    """kafka-python admin clients, each closed at the end whatever happens (an open one keeps
    a thread reconnecting to brokers long gone, into the next tests)."""
    made: list[KafkaAdminClient] = []

    def make(bootstrap: str) -> KafkaAdminClient:
        made.append(KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000))
        return made[-1]

    yield make
    for admin in made:
        admin.close()


def sees_gone(bootstrap: str, gone: int) -> bool:
    """This broker's Metadata no longer lists the broker `gone`, nor names it controller."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=3)
    return gone not in md.brokers and md.controller_id not in (gone, -1)


def test_a_partition_pinned_to_another_broker_moves_there_and_clients_follow(
    tmp_path: Path, metadata: str, kafka_admin: Callable[[str], KafkaAdminClient]
) -> None:
    with cluster(tmp_path, metadata, 3) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "r", 3)
        placed: dict[int, int] = {}
        wait_for("one partition per broker", lambda: placed.update(leaders(bootstrap, "r"))
                 or sorted(placed.values()) == [1, 2, 3])
        admin = kafka_admin(bootstrap)

        acked: list[tuple[int, int, bytes]] = []
        failed: list[str] = []
        consumed: list[tuple[int, int, bytes]] = []
        stop = threading.Event()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                acked.append((msg.partition(), msg.offset(), msg.value()))

        def produce() -> None:
            p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                          "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})
            i = 0
            while not stop.is_set():
                p.produce("r", value=f"v{i}".encode(), partition=i % 3,
                          on_delivery=on_delivery)
                p.poll(0)
                i += 1
                time.sleep(0.003)
            assert p.flush(TIMEOUT_S) == 0

        def consume() -> None:
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": "r-reader",
                          "enable.auto.commit": False, "fetch.wait.max.ms": 100})
            c.assign([TopicPartition("r", q, 0) for q in range(3)])
            try:
                idle_since = None
                while True:
                    got = [m for m in c.consume(num_messages=500, timeout=0.2)
                           if m.error() is None]
                    consumed.extend((m.partition(), m.offset(), m.value()) for m in got)
                    if not stop.is_set() or got:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > 3 and len(consumed) >= len(acked):
                        return
            finally:
                c.close()

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.5)
            moving = 0
            source = placed[moving]
            target = next(n for n in (1, 2, 3) if n != source)
            result = admin.alter_partition_reassignments({KTopicPartition("r", moving): [target]})
            assert result == {KTopicPartition("r", moving): None}
            began = time.monotonic()
            wait_for("the partition to move to its target",
                     lambda: leaders(bootstrap, "r")[moving] == target, timeout=15)
            print(f"\nreassigned partition led by its target after"
                  f" {time.monotonic() - began:.2f} s")
            assert admin.list_partition_reassignments() == {}  # done: nothing ongoing
            time.sleep(2.0)  # production continues on the new leader; it is not moved back
            assert leaders(bootstrap, "r")[moving] == target
        finally:
            stop.set()
            for t in threads:
                t.join(TIMEOUT_S + 10)
        assert not failed, failed[:5]
        assert len(acked) > 300
        assert sorted(consumed) == sorted(acked)  # every acked record, once
        for q in range(3):
            offsets = sorted(o for p, o, _ in consumed if p == q)
            assert offsets == list(range(len(offsets))), q  # contiguous, none repeated
        moved_acks = [o for p, o, _ in acked if p == moving]
        assert moved_acks  # produced on both sides of the move
        print(f"acked and consumed {len(acked)} records, {len(moved_acks)} on partition"
              f" {moving}")

        # cancel: the pin goes (the partition stays where it is until balance moves it)
        first = KTopicPartition("r", moving)
        assert admin.alter_partition_reassignments({first: None}) == {first: None}

        # a pin to a broker that is down is accepted and listed as ongoing until it is back
        other = 1
        down = next(n for n in (1, 2, 3) if n != leaders(bootstrap, "r")[other])
        node(brokers, down).stop()  # graceful: registered, not live
        rest = ",".join(b.bootstrap for b in brokers if b.proc is not None)
        # kafka-python's admin does not retry a refused connection (to a broker it learned of
        # before the stop): start it once the others' views have dropped the stopped broker,
        # and start a new one should it still have tried the stopped broker
        wait_for("the others to see the stopped broker gone", lambda: all(
            sees_gone(b.bootstrap, down) for b in brokers if b.proc is not None), timeout=15)
        admin.close()
        tp = KTopicPartition("r", other)
        pinned: list[object] = []

        def pin_to_down() -> bool:
            nonlocal admin
            admin = kafka_admin(rest)
            try:
                pinned.append(admin.alter_partition_reassignments({tp: [down]}))
            except KafkaConnectionError:
                admin.close()
                return False
            return True

        wait_for("a kafka-python admin to pin the partition", pin_to_down, timeout=20)
        assert pinned == [{tp: None}]
        time.sleep(1.5)  # a few controller heartbeats: the partition cannot go there yet
        now = leaders(rest, "r")[other]
        assert now != down
        assert admin.list_partition_reassignments() == {
            tp: {"replicas": [down, now], "adding_replicas": [down],
                 "removing_replicas": [now]}}
        assert admin.list_partition_reassignments({"r": [2]}) == {}  # filtered out
        doc = json.loads(floe("cluster", "status", "--metadata", metadata, "--json"))
        assert doc["pinned"] == [{"topic": "r", "partition": other, "leader": now,
                                  "target": down, "done": False}]
        assert f"r-{other} -> {down} (moving: leader now {now})" in floe(
            "cluster", "status", "--metadata", metadata)
        node(brokers, down).start()
        wait_for("the partition to go to its target once it is back",
                 lambda: leaders(bootstrap, "r")[other] == down, timeout=20)
        assert admin.list_partition_reassignments() == {}
        assert f"r-{other} -> {down} (done)" in floe("cluster", "status", "--metadata", metadata)

        # a cancel of a pin reached: the pin goes; a second cancel has nothing to cancel
        assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
        again = admin.alter_partition_reassignments({tp: None})
        assert again == {tp: NoReassignmentInProgressError}

        # refusals: no such broker, more than one replica, no such partition
        refused = admin.alter_partition_reassignments({
            KTopicPartition("r", 0): [99], KTopicPartition("r", 1): [1, 2],
            KTopicPartition("r", 7): [1], KTopicPartition("nope", 0): [1]})
        assert refused == {
            KTopicPartition("r", 0): InvalidReplicationAssignmentError,
            KTopicPartition("r", 1): InvalidReplicationAssignmentError,
            KTopicPartition("r", 7): UnknownTopicOrPartitionError,
            KTopicPartition("nope", 0): UnknownTopicOrPartitionError}
        time.sleep(1.0)
        assert admin.list_partition_reassignments() == {}  # nothing refused was pinned
        doc = json.loads(floe("cluster", "status", "--metadata", metadata, "--json"))
        assert doc["pinned"] == []
        admin.close()
