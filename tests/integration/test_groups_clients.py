"""Consumer groups with more real clients: the scenario of `test_groups.py` (three members in
their own processes over six partitions, one SIGKILLed, the two survivors take over within the
session timeout, every record processed at least once and none skipped) with aiokafka members
(`group_member_aiokafka.py`, committing after each `getmany` batch) and with kcat's balanced
consumer (`kcat -G`, librdkafka auto-commit).

kcat prints one `% Group G rebalanced (memberid M): assigned: T [p], ...` / `...: revoked: ...`
line per rebalance on stderr (default verbosity); the takeover is also checked through the
records the survivors print from the victim's partitions that were produced after the kill.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.conftest import kcat_binary
from tests.integration.test_groups import ROOT, Member, produce, wait_for

pytestmark = pytest.mark.integration

KCAT = kcat_binary()
TOPIC = "orders"
PARTITIONS = 6
FIRST = 3000  # records produced before the members start
MORE = 3000  # records produced right after the kill
SESSION_TIMEOUT_S = 6
TAKEOVER_MARGIN_S = 5


class AioMember(Member):
    """`Member` running `group_member_aiokafka` instead; keeps the member's stderr."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.group_member_aiokafka", bootstrap, group,
             topic],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=ROOT)
        self.assigned: list[int] = []
        self.records: list[tuple[int, int, str]] = []
        self.lock = threading.Lock()
        self.stderr: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.err_reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _close_pipes(self) -> None:
        self.err_reader.join(5)
        super()._close_pipes()
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.proc.stderr.close()

    def describe(self) -> str:
        return (f"pid {self.proc.pid} rc {self.proc.poll()} assigned {self.assigned} "
                f"records {len(self.records)}\nstderr tail:\n{''.join(self.stderr[-40:])}")


ASSIGN_LINE = re.compile(r"^% Group \S+ rebalanced \(memberid [^)]*\): (assigned|revoked): (.*)$")
PARTITION = re.compile(r"\[(\d+)\]")


class KcatMember(AioMember):
    """`kcat -G` printing `partition offset value` per record on stdout; the assignment comes
    from its rebalance lines on stderr. Stopped with SIGTERM (kcat then closes the consumer:
    final commit, LeaveGroup)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        assert KCAT is not None
        self.proc = subprocess.Popen(
            [KCAT, "-b", bootstrap, "-G", group, topic, "-o", "beginning", "-u",
             "-f", r"%p %o %s\n",
             "-X", "enable.auto.commit=true", "-X", "auto.commit.interval.ms=200",
             "-X", f"session.timeout.ms={SESSION_TIMEOUT_S * 1000}",
             "-X", "heartbeat.interval.ms=500"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assigned = []
        self.records = []
        self.lock = threading.Lock()
        self.stderr = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            p, o, v = line.split()
            with self.lock:
                self.records.append((int(p), int(o), v))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            m = ASSIGN_LINE.match(line.strip())
            if m is not None:
                with self.lock:
                    self.assigned = ([] if m[1] == "revoked" else
                                     sorted(int(p) for p in PARTITION.findall(m[2])))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.reader.join(5)
        self._close_pipes()


@contextmanager
def explained(broker: BrokerProcess, members: Sequence[AioMember]) -> Iterator[None]:
    """Re-raise an assertion failure with every member's state and stderr and the broker log."""
    try:
        yield
    except AssertionError as e:
        details = "\n".join(f"--- member {i}: {m.describe()}" for i, m in enumerate(members))
        raise AssertionError(
            f"{e}\n{details}\n--- broker log tail:\n{broker.log()[-6000:]}") from e


def committed(bootstrap: str, group: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def kill_one_of_three(broker: BrokerProcess, group: str,
                      start: Callable[[str, str, str], AioMember]) -> None:
    """Three members share six partitions; the first is SIGKILLed once it has processed some
    records, and more records are produced; the survivors must take over the victim's
    partitions within the session timeout (plus a margin), and between them every produced
    record must be processed at least once, with one value per offset."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(10)
    produced = produce(broker.bootstrap, TOPIC, 0, FIRST, PARTITIONS)
    members = [start(broker.bootstrap, group, TOPIC) for _ in range(3)]
    after_kill: dict[tuple[int, int], str] = {}
    more: threading.Thread | None = None
    try:
        with explained(broker, members):
            wait_for(lambda: sorted(len(m.assigned) for m in members) == [2, 2, 2], 30,
                     "three members with two partitions each")
            assert sorted(p for m in members for p in m.assigned) == list(range(PARTITIONS))
            wait_for(lambda: len(members[0].records) > 0, 20, "member 0 to process records")
            victim_partitions = set(members[0].assigned)
            members[0].kill()
            killed_at = time.monotonic()
            more = threading.Thread(target=lambda: after_kill.update(
                produce(broker.bootstrap, TOPIC, FIRST, MORE, PARTITIONS)))
            more.start()
            survivors = members[1:]
            took = wait_for(lambda: sorted(len(m.assigned) for m in survivors) == [3, 3], 30,
                            "the two survivors to take over")
            assert took < SESSION_TIMEOUT_S + TAKEOVER_MARGIN_S, (
                f"takeover took {took:.1f}s (session timeout {SESSION_TIMEOUT_S} s)")
            assert victim_partitions <= {p for m in survivors for p in m.assigned}
            more.join(60)
            assert not more.is_alive(), "producing after the kill did not finish"
            assert len(after_kill) == MORE
            produced.update(after_kill)

            def victim_partitions_resumed() -> bool:
                got = {p for m in survivors for (p, o, _v) in list(m.records)
                       if (p, o) in after_kill}
                return victim_partitions <= got

            wait_for(victim_partitions_resumed, 30,
                     "survivors to process post-kill records of the victim's partitions")
            resumed = time.monotonic() - killed_at
            assert resumed < SESSION_TIMEOUT_S + TAKEOVER_MARGIN_S, (
                f"post-kill records of the victim's partitions first processed after "
                f"{resumed:.1f}s (session timeout {SESSION_TIMEOUT_S} s)")

            def all_processed() -> bool:
                seen = {(p, o) for m in members for (p, o, _v) in list(m.records)}
                return set(produced) <= seen

            wait_for(all_processed, 60, "every record to be processed")
            for m in survivors:
                m.stop()
            seen: dict[tuple[int, int], str] = {}
            for m in members:
                for p, o, v in m.records:
                    assert seen.setdefault((p, o), v) == v, f"offset {p}/{o}: two values"
            missing = sorted(set(produced) - set(seen))
            assert not missing, f"{len(missing)} records skipped, e.g. {missing[:10]}"
            assert all(seen[k] == v for k, v in produced.items())
            # every member committed what it processed before it stopped
            per_partition = (FIRST + MORE) // PARTITIONS
            assert committed(broker.bootstrap, group) == dict.fromkeys(
                range(PARTITIONS), per_partition)
    finally:
        for m in members:
            m.stop()
        if more is not None:
            more.join(60)


def test_aiokafka_three_members_survive_a_kill(broker: BrokerProcess) -> None:
    kill_one_of_three(broker, "billing-aiokafka", AioMember)


@pytest.mark.skipif(KCAT is None, reason="kcat/kafkacat not installed")
def test_kcat_balanced_consumers_survive_a_kill(broker: BrokerProcess) -> None:
    kill_one_of_three(broker, "billing-kcat", KcatMember)
