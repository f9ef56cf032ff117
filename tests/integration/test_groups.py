"""Consumer groups with real clients: balanced assignment, takeover when a member dies,
at-least-once processing with commits, committed offsets surviving a broker SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


class Member:
    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.group_member", bootstrap, group, topic],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.assigned: list[int] = []
        self.records: list[tuple[int, int, str]] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            with self.lock:
                if parts[0] == "ASSIGNED":
                    self.assigned = [int(p) for p in parts[1].split(",")] if len(parts) > 1 else []
                elif parts[0] == "REC":
                    self.records.append((int(parts[1]), int(parts[2]), parts[3]))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.reader.join(5)
        self._close_pipes()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.reader.join(5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                f.close()


def wait_for(cond: object, timeout: float, what: str) -> float:
    assert callable(cond)
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def produce(bootstrap: str, topic: str, start: int, count: int, partitions: int) -> dict[
    tuple[int, int], str
]:
    acked: dict[tuple[int, int], str] = {}
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(start, start + count):
        p.produce(topic, f"v{i}".encode(), partition=i % partitions,
                  on_delivery=lambda e, m: acked.__setitem__(
                      (m.partition(), m.offset()), m.value().decode()) if e is None else None)
    assert p.flush(30) == 0
    assert len(acked) == count
    return acked


def test_three_members_share_six_partitions_and_survive_a_kill(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("orders", 6, 1)])["orders"].result(10)
    produced = produce(broker.bootstrap, "orders", 0, 3000, 6)
    members = [Member(broker.bootstrap, "billing", "orders") for _ in range(3)]
    try:
        wait_for(lambda: sorted(len(m.assigned) for m in members) == [2, 2, 2], 30,
                 "three members with two partitions each")
        assert sorted(p for m in members for p in m.assigned) == list(range(6))
        wait_for(lambda: len(members[0].records) > 0, 20, "member 0 to process records")
        victim_partitions = set(members[0].assigned)
        members[0].kill()
        more = threading.Thread(target=lambda: produced.update(
            produce(broker.bootstrap, "orders", 3000, 3000, 6)))
        more.start()
        took = wait_for(lambda: sorted(len(m.assigned) for m in members[1:]) == [3, 3], 30,
                        "the two survivors to take over")
        assert took < 6 + 5, f"takeover took {took:.1f}s (session timeout 6 s)"
        assert victim_partitions <= set(members[1].assigned) | set(members[2].assigned)
        more.join(60)
        assert len(produced) == 6000

        def all_processed() -> bool:
            seen = {(p, o) for m in members for (p, o, _v) in list(m.records)}
            return set(produced) <= seen

        wait_for(all_processed, 60, "every record to be processed")
    finally:
        for m in members:
            m.stop()
    seen: dict[tuple[int, int], str] = {}
    for m in members:
        for p, o, v in m.records:
            assert seen.setdefault((p, o), v) == v, "one offset, two values"
    assert set(produced) <= set(seen), "a record was skipped"
    assert all(seen[k] == v for k, v in produced.items())


def test_committed_offsets_survive_broker_sigkill(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("ledger", 2, 1)])["ledger"].result(10)
    produce(broker.bootstrap, "ledger", 0, 100, 2)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "audit",
                  "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("ledger", 0, 17), TopicPartition("ledger", 1, 33)],
             asynchronous=False)
    c.close()
    broker.kill()
    broker.start()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "audit",
                  "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition("ledger", 0), TopicPartition("ledger", 1)], 10)
        assert [(tp.partition, tp.offset) for tp in got] == [(0, 17), (1, 33)]
    finally:
        c.close()


def test_floe_groups_describe_shows_lag(broker: BrokerProcess) -> None:
    import json

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("lagged", 2, 1)])["lagged"].result(10)
    produce(broker.bootstrap, "lagged", 0, 50, 2)  # 25 per partition
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watchers",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000})
    try:
        c.subscribe(["lagged"])
        wait_for(lambda: c.poll(0.2) is not None and len(c.assignment()) == 2, 20, "assignment")
        c.commit(offsets=[TopicPartition("lagged", 0, 10), TopicPartition("lagged", 1, 25)],
                 asynchronous=False)
        out = subprocess.run(
            [sys.executable, "-m", "broker.cli", "groups", "describe", "watchers",
             "--bootstrap", broker.bootstrap, "--json"],
            capture_output=True, text=True, timeout=30, cwd=ROOT, check=True).stdout
        report = json.loads(out)
        assert report["state"] == "Stable" and len(report["members"]) == 1
        assert sorted(report["members"][0]["assignment"]) == ["lagged-0", "lagged-1"]
        rows = {(r["topic"], r["partition"]): r for r in report["partitions"]}
        assert (rows[("lagged", 0)]["committed"], rows[("lagged", 0)]["end"],
                rows[("lagged", 0)]["lag"]) == (10, 25, 15)
        assert rows[("lagged", 1)]["lag"] == 0
        text = subprocess.run(
            [sys.executable, "-m", "broker.cli", "groups", "describe", "watchers",
             "--bootstrap", broker.bootstrap], capture_output=True, text=True, timeout=30,
            cwd=ROOT, check=True).stdout
        assert "LAG" in text and "lagged" in text
    finally:
        c.close()


def test_group_admin_list_describe_alter_delete(broker: BrokerProcess) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("admin-t", 2, 1)])["admin-t"].result(10)
    produce(broker.bootstrap, "admin-t", 0, 20, 2)
    req = ConsumerGroupTopicPartitions("offline", [TopicPartition("admin-t", 0, 7),
                                                   TopicPartition("admin-t", 1, 9)])
    admin.alter_consumer_group_offsets([req])["offline"].result(10)
    got = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("offline")])["offline"].result(10)
    assert sorted((tp.partition, tp.offset) for tp in got.topic_partitions) == [(0, 7), (1, 9)]
    listed = admin.list_consumer_groups().result(10)
    assert "offline" in {g.group_id for g in listed.valid}
    desc = admin.describe_consumer_groups(["offline"])["offline"].result(10)
    assert str(desc.state).endswith("EMPTY") and not desc.members
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "busy",
                  "session.timeout.ms": 6000, "auto.offset.reset": "earliest"})
    try:
        c.subscribe(["admin-t"])
        wait_for(lambda: c.poll(0.2) is not None and len(c.assignment()) == 2, 20, "assignment")
        with pytest.raises(Exception, match="NON_EMPTY_GROUP"):
            admin.delete_consumer_groups(["busy"])["busy"].result(10)
    finally:
        c.close()
    admin.delete_consumer_groups(["offline"])["offline"].result(10)
    after = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("offline")])["offline"].result(10)
    assert all(tp.offset < 0 for tp in after.topic_partitions)
