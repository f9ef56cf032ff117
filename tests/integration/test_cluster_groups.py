"""Consumer groups over several brokers (issue 12): each group is coordinated by the live
broker broker.cluster.coordinators places it on, whichever broker its members bootstrap to;
SIGKILLed, the coordinator's groups move, members rejoin there, and consumption goes on
from the committed offsets. Real `floe broker` processes, confluent_kafka clients."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from broker.cluster.coordinators import COORDINATOR_SLOTS, slot_of, slot_owner
from tests.brokerproc import running_broker
from tests.integration.test_cluster import (
    TIMEOUT_S,
    cluster,
    create_topic,
    leaders,
    node,
    wait_for,
)
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 6


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    return str(request.getfixturevalue("pg_url"))


def group_led_by(node_id: int, nodes: list[int]) -> str:
    return next(g for g in (f"grp-{i}" for i in range(1000))
                if slot_owner(slot_of(g), nodes) == node_id)


def coordinator(bootstrap: str, group: str) -> tuple[int, str, int]:
    """(coordinator node id, state, members), as DescribeGroups on the coordinator says."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer is in
    (f,) = admin.describe_consumer_groups([group]).values()
    d = f.result(timeout=10)
    return d.coordinator.id, str(d.state), len(d.members)


def test_a_group_moves_with_its_coordinator_and_consumption_goes_on(
    tmp_path: Path, metadata: str
) -> None:
    with cluster(tmp_path, metadata, 3) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "t", PARTITIONS)
        group = group_led_by(3, [1, 2, 3])  # members bootstrap to brokers 1 and 2
        wait_for("every broker to see the others", lambda: all(
            coordinator(b.bootstrap, group)[0] == 3 for b in brokers))
        acked: set[tuple[int, int]] = set()
        failed: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                acked.add((msg.partition(), msg.offset()))

        consumed: list[tuple[int, int]] = []
        assigned: dict[int, set[int]] = {0: set(), 1: set()}
        commits: dict[int, list[int]] = defaultdict(list)  # sampled committed offsets
        stop = threading.Event()
        lock = threading.Lock()

        def member(i: int, boot: str) -> None:
            c = Consumer({"bootstrap.servers": boot, "group.id": group,
                          "enable.auto.commit": False, "auto.offset.reset": "earliest",
                          "fetch.wait.max.ms": 100, "session.timeout.ms": 6000,
                          "heartbeat.interval.ms": 500})

            def on_assign(_: Consumer, tps: list[TopicPartition]) -> None:
                assigned[i] = {tp.partition for tp in tps}

            c.subscribe(["t"], on_assign=on_assign)
            try:
                while not stop.is_set():
                    msgs = [m for m in c.consume(num_messages=200, timeout=0.2)
                            if m.error() is None]
                    with lock:
                        consumed.extend((m.partition(), m.offset()) for m in msgs)
                    if msgs:  # the coordinator moving: the next batch commits again
                        with contextlib.suppress(Exception):
                            c.commit(asynchronous=False)
            finally:
                c.close()

        def sample() -> None:
            c = Consumer({"bootstrap.servers": brokers[0].bootstrap, "group.id": group})
            try:
                while not stop.is_set():
                    try:
                        tps = c.committed([TopicPartition("t", p) for p in range(PARTITIONS)],
                                          timeout=2)
                    except Exception:
                        continue
                    for tp in tps:
                        if tp.offset >= 0:
                            commits[tp.partition].append(tp.offset)
                    time.sleep(0.2)
            finally:
                c.close()

        threads = [threading.Thread(target=member, args=(0, brokers[0].bootstrap)),
                   threading.Thread(target=member, args=(1, brokers[1].bootstrap)),
                   threading.Thread(target=sample)]
        for t in threads:
            t.start()
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})
        try:
            try:
                wait_for("both members assigned, the partitions split",
                         lambda: assigned[0] and assigned[1]
                         and assigned[0] | assigned[1] == set(range(PARTITIONS))
                         and not assigned[0] & assigned[1])
            except AssertionError:  # where the group stood, as each broker answers for it
                print(f"assigned: {assigned}")
                for b in brokers:
                    with contextlib.suppress(Exception):
                        print(f"via {b.bootstrap}: {coordinator(b.bootstrap, group)}")
                raise
            seq, started, killed = 0, time.monotonic(), False
            while time.monotonic() - started < 10.0:
                for p in range(PARTITIONS):
                    producer.produce("t", value=f"{p}-{seq}".encode(), partition=p,
                                     on_delivery=on_delivery)
                seq += 1
                producer.poll(0.02)
                if not killed and time.monotonic() - started > 3.0:
                    node(brokers, 3).kill()
                    killed = True
            assert producer.flush(TIMEOUT_S) == 0
            assert not failed, failed[:5]
            alive = ",".join(b.bootstrap for b in brokers[:2])
            wait_for("the group on a new coordinator, both members back",
                     lambda: coordinator(alive, group) == (slot_owner(slot_of(group), [1, 2]),
                                                          "ConsumerGroupState.STABLE", 2))
            wait_for("every acknowledged record consumed",
                     lambda: acked <= set(consumed), timeout=60)
        finally:
            stop.set()
            for t in threads:
                t.join(TIMEOUT_S)
        for p in range(PARTITIONS):
            seen = sorted({o for q, o in consumed if q == p})
            assert seen == list(range(len(seen))), f"t-{p}: a record skipped"
            assert commits[p] == sorted(commits[p]), f"t-{p}: committed offset went back"
        assert any(len(set(v)) > 1 for v in commits.values()), "no commit sampled"
        print(f"\n{len(acked)} records acknowledged, {len(consumed)} consumed (at least once)")


def floe(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "broker.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cluster_status_shows_brokers_leaders_and_coordinator_slots(tmp_path: Path) -> None:
    meta = f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    shared = ["--object-store", (tmp_path / "objects").resolve().as_uri(), "--metadata", meta]
    with contextlib.ExitStack() as stack:
        brokers = [stack.enter_context(running_broker(
            tmp_path / f"b{n}", "--node-id", str(n), "--rack", f"zone-{z}", *shared))
            for n, z in ((1, "a"), (2, "b"))]
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "s", 4)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        wait_for("both brokers in DescribeCluster, with their racks", lambda: sorted(
            (n.id, n.rack) for n in admin.describe_cluster().result(timeout=10).nodes)
            == [(1, "zone-a"), (2, "zone-b")])
        placed: dict[int, int] = {}
        wait_for("two partitions per broker", lambda: placed.update(leaders(bootstrap, "s"))
                 or sorted(placed.values()) == [1, 1, 2, 2])
        doc = json.loads(floe("cluster", "status", "--metadata", meta, "--json"))
        assert [(b["node_id"], b["live"], b["rack"]) for b in doc["brokers"]] == [
            (1, True, "zone-a"), (2, True, "zone-b")]
        assert {f"{b['host']}:{b['port']}" for b in doc["brokers"]} == {
            b.bootstrap for b in brokers}
        assert doc["controller"] in (1, 2)
        rows = {p["partition"]: p["leader"] for p in doc["partitions"] if p["topic"] == "s"}
        assert rows == placed
        assert all(p["leader_epoch"] >= 1 for p in doc["partitions"])
        slots = doc["coordinator_slots"]
        assert len(slots) == COORDINATOR_SLOTS and set(slots.values()) == {1, 2}
        assert slots == {str(s): slot_owner(s, [1, 2]) for s in range(COORDINATOR_SLOTS)}
        text = floe("cluster", "status", "--metadata", meta)
        assert "controller" in text and f"s  0:{placed[0]}@" in text
        port = json.loads(floe("cluster", "status", "--metrics", brokers[1].admin_address(),
                               "--json"))
        assert [(b["node_id"], b["rack"]) for b in port["brokers"]] == [(1, "zone-a"),
                                                                       (2, "zone-b")]
        assert port["controller"] == doc["controller"] and port["partitions"] is None
        assert port["coordinator_slots"] == slots
        assert "zone-a" in text
        node(brokers, 2).kill()
        wait_for("broker 2's lease to run out", lambda: [
            b["live"] for b in json.loads(floe("cluster", "status", "--metadata", meta,
                                               "--json"))["brokers"]] == [True, False])
        text = floe("cluster", "status", "--metadata", meta)
        assert "dead" in text and "expired" in text
