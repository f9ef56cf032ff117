"""Table topics as read-only consumer groups (issue 13): `floe-table.<namespace>.<table>` lists,
describes and fetches offsets like an Empty consumer group whose committed offsets are the
table's `floe.offsets` (the rows the table coordinator publishes, broker.metadata.tablework),
with real clients (confluent-kafka, kafka-python) and `floe groups`; every change by a client
is refused with GROUP_AUTHORIZATION_FAILED, even for a table that does not exist.

Until the table coordinator publishes progress, the tests publish it the way it will: a
second metadata store on the broker's SQLite file calling TableWork.settle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # (re-exported by .admin, untyped there)

from broker.client import Client, nested
from broker.metadata.tablework import TableWork
from s3stream.metadata import SqliteMetadataStore
from tests.brokerproc import BrokerProcess, running_broker

# kafka-python 3.0 reads its protocol schemas with importlib.resources.open_text (deprecated)
_KAFKA_SCHEMA_WARNING = "open_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", _KAFKA_SCHEMA_WARNING, DeprecationWarning)
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka import errors as kafka_errors

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings(f"ignore:{_KAFKA_SCHEMA_WARNING}:DeprecationWarning")]
ROOT = Path(__file__).resolve().parents[2]
GROUP = "floe-table.default.orders"
METADATA = "Iceberg table default.orders at snapshot "
REFUSED = KafkaError.GROUP_AUTHORIZATION_FAILED


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "floe-data") as b:
        yield b


def settle(data_dir: Path, topic: str, table: str, offsets: Mapping[int, int],
           snapshot_id: int | None) -> None:
    """Publish a table's progress as the table coordinator does after a commit (as the leader
    of the topic's partition 0, at its epoch)."""
    with contextlib.closing(sqlite3.connect(data_dir / "meta.db")) as db:
        leader, epoch = db.execute("SELECT leader, leader_epoch FROM kafka_partitions WHERE"
                                   " topic=? AND partition=0", (topic,)).fetchone()

    async def run() -> None:
        store = SqliteMetadataStore(data_dir / "meta.db")
        await store.open()
        try:
            assert await TableWork(store).settle(topic, table, offsets, snapshot_id, [], leader,
                                                 epoch)
        finally:
            await store.close()

    asyncio.run(run())


def produce(bootstrap: str, topic: str, counts: Mapping[int, int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for partition, n in counts.items():
        for i in range(n):
            p.produce(topic, f"v{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def committed(admin: AdminClient, group: str) -> dict[int, tuple[int, str | None]]:
    got = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)])[group].result(10)
    return {tp.partition: (tp.offset, tp.metadata) for tp in got.topic_partitions}


def floe_groups(bootstrap: str, *args: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "broker.cli", "groups", *args, "--bootstrap",
                          bootstrap, "--json"], capture_output=True, text=True, timeout=30,
                         cwd=ROOT, check=True).stdout
    return json.loads(out)


def alter_refused(admin: AdminClient, group: str, topic: str, partition: int) -> int:
    """The error code of an offset commit by AdminClient (per partition)."""
    alter = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, partition, 1)])
    got = admin.alter_consumer_group_offsets([alter])[group].result(10)
    (tp,) = got.topic_partitions
    assert tp.error is not None, "the commit was taken"
    return int(tp.error.code())


def refused(fut: Any) -> int:
    """The Kafka error code a failed admin future carries."""
    with pytest.raises(KafkaException) as e:
        fut.result(10)
    err = e.value.args[0]
    assert isinstance(err, KafkaError)
    return int(err.code())


def test_table_group_shows_the_table_offsets_and_is_read_only(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("orders", 2, 1)])["orders"].result(10)
    produce(broker.bootstrap, "orders", {0: 10, 1: 6})
    settle(broker.data_dir, "orders", "default.orders", {0: 4, 1: 6}, 1234)

    # ListGroups, DescribeGroups, OffsetFetch (confluent-kafka)
    listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
    assert GROUP in listed
    assert listed[GROUP].state == ConsumerGroupState.EMPTY
    assert not listed[GROUP].is_simple_consumer_group  # protocol type "consumer"
    empty_only = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(10)
    assert GROUP in {g.group_id for g in empty_only.valid}
    stable_only = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(10)
    assert GROUP not in {g.group_id for g in stable_only.valid}
    d = admin.describe_consumer_groups([GROUP])[GROUP].result(10)
    assert d.state == ConsumerGroupState.EMPTY and d.members == []
    for _ in range(5):  # (metadata without a NUL came back with stray bytes, now and then)
        assert committed(admin, GROUP) == {0: (4, METADATA + "1234"), 1: (6, METADATA + "1234")}
    asked = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        GROUP, [TopicPartition("orders", 1), TopicPartition("other", 0)])])[GROUP].result(10)
    assert sorted((tp.topic, tp.partition, tp.offset) for tp in asked.topic_partitions) == [
        ("orders", 1, 6), ("other", 0, -1001)]  # -1001: OFFSET_INVALID, none committed

    # kafka-python: OffsetFetch (v8), ListGroups; OffsetDelete refused
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        offs = kp.list_group_offsets(GROUP)[GROUP]
        assert {(tp.topic, tp.partition): (om.offset, om.metadata, om.leader_epoch)
                for tp, om in offs.items()} == {("orders", 0): (4, METADATA + "1234\0", -1),
                                                ("orders", 1): (6, METADATA + "1234\0", -1)}
        assert {"group_id": GROUP, "protocol_type": "consumer", "group_state": "Empty"}.items() <= (
            next(g for g in kp.list_groups() if g["group_id"] == GROUP).items())
        with pytest.raises(kafka_errors.GroupAuthorizationFailedError):
            kp.delete_group_offsets(GROUP, [KafkaTopicPartition("orders", 0)])
    finally:
        kp.close()

    # floe groups list / describe: lag = log end - table offset
    assert {"group": GROUP, "state": "Empty"} in floe_groups(broker.bootstrap, "list")
    report = floe_groups(broker.bootstrap, "describe", GROUP)
    assert report["state"] == "Empty" and report["members"] == []
    rows = {r["partition"]: (r["committed"], r["end"], r["lag"]) for r in report["partitions"]}
    assert rows == {0: (4, 10, 6), 1: (6, 6, 0)}

    # a client may not change it: alter, delete offsets, delete the group
    code = alter_refused(admin, GROUP, "orders", 0)
    assert code == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert refused(admin.delete_consumer_groups([GROUP])[GROUP]) == (
        KafkaError.GROUP_AUTHORIZATION_FAILED)
    assert committed(admin, GROUP)[0][0] == 4

    # the table commits again: the group's offsets follow
    settle(broker.data_dir, "orders", "default.orders", {0: 10, 1: 6}, 1235)
    assert committed(admin, GROUP) == {0: (10, METADATA + "1235"), 1: (6, METADATA + "1235")}
    report = floe_groups(broker.bootstrap, "describe", GROUP)
    assert [r["lag"] for r in report["partitions"]] == [0, 0]


def test_unknown_table_group_is_unknown_but_reserved(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("plain", 1, 1)])["plain"].result(10)
    produce(broker.bootstrap, "plain", {0: 3})
    group = "floe-table.x.y"  # no table publishes it
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    d = admin.describe_consumer_groups([group])[group].result(10)
    assert d.state == ConsumerGroupState.DEAD
    assert committed(admin, group) == {}

    # a consumer of the reserved group gets a clear error at once, not a hang
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    try:
        c.subscribe(["plain"])
        err = None
        deadline = time.monotonic() + 20
        while err is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is not None:
                err = m.error()
            assert m is None or m.error() is not None, "a record reached the refused consumer"
        assert err is not None, "the consumer saw no error within 20 s"
        assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        assert not err.retriable()
    finally:
        c.close()

    # nor commit offsets to it (a simple, unmanaged commit)
    assert alter_refused(admin, group, "plain", 0) == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert committed(admin, group) == {}
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}



def test_every_offset_fetch_version_and_every_change_refused(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("orders", 2, 1)])["orders"].result(10)
    produce(broker.bootstrap, "orders", {0: 5, 1: 5})
    settle(broker.data_dir, "orders", "default.orders", {0: 3, 1: 5}, 7)
    regular = ConsumerGroupTopicPartitions("billing", [TopicPartition("orders", 0, 2)])
    admin.alter_consumer_group_offsets([regular])["billing"].result(10)

    def offsets(topics: Any) -> dict[tuple[str, int], tuple[int, int, str]]:
        return {(t.name, p.partition_index): (  # no leader epoch before v5
            p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.metadata)
            for t in topics for p in t.partitions}

    table = {("orders", 0): (3, -1, METADATA + "7\0"), ("orders", 1): (5, -1, METADATA + "7\0")}
    with Client(broker.bootstrap) as c:
        for version in range(1, 8):
            topic = nested(9, version, "OffsetFetchRequestTopic")
            extra: dict[str, Any] = {"require_stable": True} if version == 7 else {}
            asked = (topic(name="orders", partition_indexes=(0, 1)),)
            r = c.request(9, version, group_id=GROUP, topics=asked, **extra)
            assert offsets(r.topics) == table, f"OffsetFetch v{version}"
            if version >= 2:  # topics null: all the group's offsets
                r = c.request(9, version, group_id=GROUP, topics=None, **extra)
                assert (r.error_code, offsets(r.topics)) == (0, table), f"v{version} all"
        group = nested(9, 8, "OffsetFetchRequestGroup")
        r = c.request(9, 8, require_stable=False, groups=(
            group(group_id=GROUP, topics=None), group(group_id="billing", topics=None),
            group(group_id="floe-table.default.none", topics=None)))
        got = {g.group_id: (g.error_code, offsets(g.topics)) for g in r.groups}
        assert got == {GROUP: (0, table), "billing": (0, {("orders", 0): (2, -1, "")}),
                       "floe-table.default.none": (0, {})}
        # Heartbeat, LeaveGroup (v0 and the batch form), OffsetCommit: refused
        for version in (0, 4):
            extra = {"group_instance_id": None} if version >= 3 else {}
            r = c.request(12, version, group_id=GROUP, generation_id=1, member_id="m", **extra)
            assert r.error_code == REFUSED, f"Heartbeat v{version}"
        assert c.request(13, 0, group_id=GROUP, member_id="m").error_code == REFUSED
        member = nested(13, 3, "MemberIdentity")
        r = c.request(13, 3, group_id=GROUP, members=(member(member_id="m",
                                                             group_instance_id=None),))
        assert r.error_code == REFUSED

    # a transactional producer may not add the table group's offsets to its transaction
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tg-txn"})
    c2 = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP})
    try:
        p.init_transactions(10)
        p.begin_transaction()
        with pytest.raises(KafkaException) as e:
            p.send_offsets_to_transaction([TopicPartition("orders", 0, 1)],
                                          c2.consumer_group_metadata(), 10)
        assert e.value.args[0].code() == REFUSED
        p.abort_transaction(10)
    finally:
        c2.close()
    assert committed(admin, GROUP)[0][0] == 3

# End to end: the offsets are those the table coordinator (tabletopic.coordinator) publishes
# after its commits, not the test's.
def test_table_topic_group_reaches_the_log_end(tmp_path: Path) -> None:
    topic, group = "lagging", "floe-table.default.lagging"
    with running_broker(tmp_path / "floe-data") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {"table.topic.enable": "true", "table.topic.convert.value.type": "json",
                  "table.topic.commit.interval.ms": "500"}
        admin.create_topics([NewTopic(topic, 2, 1, config=config)])[topic].result(10)
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(200):
            p.produce(topic, json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=i % 2)
        assert p.flush(30) == 0
        ends = {0: 100, 1: 100}
        deadline = time.monotonic() + 60
        got: dict[int, int] = {}
        while time.monotonic() < deadline:
            got = {p: o for p, (o, _md) in committed(admin, group).items()}
            if got == ends:
                break
            time.sleep(0.5)
        assert got == ends, f"the table group's offsets {got} never reached the log end {ends}"
        listed = {g.group_id: g.state for g in admin.list_consumer_groups().result(10).valid}
        assert listed[group] == ConsumerGroupState.EMPTY
        report = floe_groups(broker.bootstrap, "describe", group)
        assert [(r["partition"], r["lag"]) for r in report["partitions"]] == [(0, 0), (1, 0)]
