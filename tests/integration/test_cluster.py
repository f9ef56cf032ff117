"""Brokers sharing one object store and one metadata database (issue 12): a partition's
leader dies or is paused past its lease, another broker takes the partition over, and clients
follow. Real `floe broker` processes on 127.0.0.1 sharing a file object store and one metadata
database: a SQLite file, or PostgreSQL (tests/pg.py); confluent_kafka clients."""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT_S = 30.0
FAILOVER_TARGET_S = 5.0


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    return str(request.getfixturevalue("pg_url"))


@contextmanager
def cluster(
    tmp_path: Path, metadata: str, nodes: int, *args: str
) -> Iterator[list[BrokerProcess]]:
    shared = ["--object-store", (tmp_path / "objects").resolve().as_uri(), "--metadata", metadata]
    brokers: list[BrokerProcess] = []
    try:
        for n in range(1, nodes + 1):
            b = BrokerProcess(tmp_path / f"b{n}", ["--node-id", str(n), *shared, *args])
            brokers.append(b.start())
        yield brokers
    except BaseException:  # what the brokers said goes into the failure's captured output
        for b in brokers:
            print(f"--- broker {b.extra_args[1]} log (last 100 lines) ---")
            print("".join(b.output[-100:]), end="")
        raise
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.send_signal(signal.SIGCONT)
            b.stop()


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader node id (-1: none), as a broker's Metadata has it."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=3)
    t = md.topics[topic]
    assert t.error is None, t.error
    return {p: t.partitions[p].leader for p in t.partitions}


def wait_for(what: str, check: object, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert callable(check)
        try:
            if check():
                return
        except Exception:  # a broker not answering yet
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (f,) = admin.create_topics([NewTopic(topic, partitions, 1)]).values()
    f.result(timeout=TIMEOUT_S)


def node(brokers: list[BrokerProcess], node_id: int) -> BrokerProcess:
    return brokers[node_id - 1]


def test_sigkill_of_a_leader_loses_nothing_and_production_resumes(
    tmp_path: Path, metadata: str
) -> None:
    with cluster(tmp_path, metadata, 3) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "t", 3)
        placed: dict[int, int] = {}
        wait_for("one partition per broker", lambda: placed.update(leaders(bootstrap, "t"))
                 or sorted(placed.values()) == [1, 2, 3])
        acked: list[tuple[int, int, bytes, float]] = []  # partition, offset, value, when
        failed: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                acked.append((msg.partition(), msg.offset(), msg.value(), time.monotonic()))

        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})
        consumed: list[tuple[int, int, bytes]] = []
        stop = threading.Event()

        def consume() -> None:
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                          "enable.auto.commit": False, "fetch.wait.max.ms": 100})
            c.assign([TopicPartition("t", p, 0) for p in range(3)])
            try:
                while not stop.is_set():
                    for m in c.consume(num_messages=500, timeout=0.2):
                        if m.error() is None:
                            consumed.append((m.partition(), m.offset(), m.value()))
            finally:
                c.close()

        reader = threading.Thread(target=consume)
        reader.start()
        try:
            victim = placed[0]
            seq = 0
            killed_at = 0.0
            started = time.monotonic()
            while time.monotonic() - started < 12.0:
                for p in range(3):
                    producer.produce("t", value=f"{p}-{seq}".encode(), partition=p,
                                     on_delivery=on_delivery)
                seq += 1
                producer.poll(0.01)
                if not killed_at and time.monotonic() - started > 3.0:
                    node(brokers, victim).kill()
                    killed_at = time.monotonic()
            assert producer.flush(TIMEOUT_S) == 0
            assert not failed, failed[:5]
            resumed = min(t for p, _, _, t in acked if p == 0 and t > killed_at) - killed_at
            print(f"\nleader of t-0 (broker {victim}) SIGKILLed; t-0 took acks again after"
                  f" {resumed:.2f} s; {len(acked)} records acknowledged")
            assert resumed < FAILOVER_TARGET_S
            want = {(p, o): v for p, o, v, _ in acked}
            wait_for("every acknowledged record consumed",
                     lambda: want.keys() <= {(p, o) for p, o, _ in consumed})
        finally:
            stop.set()
            reader.join(TIMEOUT_S)
        got: dict[tuple[int, int], bytes] = {}
        for p, o, v in consumed:
            assert (p, o) not in got, f"offset {o} of t-{p} consumed twice"
            got[(p, o)] = v
        for p in range(3):
            offsets = sorted(o for q, o in got if q == p)
            assert offsets == list(range(len(offsets))), f"t-{p}: offsets not contiguous"
        values = list(got.values())
        assert len(values) == len(set(values)), "a record was written twice"
        assert all(got[k] == v for k, v in want.items())


def wal_flushes(b: BrokerProcess) -> float:
    """The broker's count of WAL objects written and committed (its /metrics)."""
    with urllib.request.urlopen(f"http://{b.admin_address()}/metrics", timeout=10) as r:
        text = r.read().decode()
    (value,) = re.findall(r"^floe_wal_flushes_total (\S+)$", text, re.MULTILINE)
    return float(value)


def test_a_paused_leader_commits_nothing_and_its_clients_move(
    tmp_path: Path, metadata: str
) -> None:
    # a long WAL flush interval keeps the paused broker's append pending across the pause
    with cluster(tmp_path, metadata, 2, "--set", "wal.flush.interval.ms=1000") as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "s", 1)
        found: dict[int, int] = {}
        wait_for("a leader", lambda: found.update(leaders(bootstrap, "s")) or
                 found.get(0) in (1, 2))
        old = found[0]
        paused, other = node(brokers, old), node(brokers, 3 - old)
        assert paused.proc is not None
        results: dict[bytes, tuple[str | None, int]] = {}

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            results[msg.value()] = (None if err is None else str(err), msg.offset())

        flushes = wal_flushes(paused)
        # a client of the paused broker only: its append is pending when the pause starts
        stranded = Producer({"bootstrap.servers": paused.bootstrap, "acks": "all",
                             "message.timeout.ms": 60000})
        stranded.produce("s", value=b"from-paused", partition=0, on_delivery=on_delivery)
        stranded.poll(0.3)
        paused.proc.send_signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        wait_for("the other broker to lead",
                 lambda: leaders(other.bootstrap, "s")[0] == 3 - old, timeout=15)
        print(f"\nbroker {3 - old} leads s-0 {time.monotonic() - paused_at:.2f} s after"
              f" broker {old} was paused")
        # resumed: its pending append fits the log's end (offset 0: nobody wrote since), yet
        # it must not be committed by the deposed broker; the client is sent to the new
        # leader, which writes it
        paused.proc.send_signal(signal.SIGCONT)
        assert stranded.flush(TIMEOUT_S) == 0
        fresh = Producer({"bootstrap.servers": other.bootstrap, "acks": "all"})
        for i in range(4):
            fresh.produce("s", value=f"new-{i}".encode(), partition=0, on_delivery=on_delivery)
        assert fresh.flush(TIMEOUT_S) == 0
        assert wal_flushes(paused) == flushes  # the resumed broker committed nothing
        assert results == {b"from-paused": (None, 0), b"new-0": (None, 1), b"new-1": (None, 2),
                           b"new-2": (None, 3), b"new-3": (None, 4)}
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                      "enable.auto.commit": False})
        try:
            c.assign([TopicPartition("s", 0, 0)])
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < 5 and time.monotonic() < deadline:
                for m in c.consume(num_messages=10, timeout=0.5):
                    if m.error() is None:
                        got.append((m.offset(), m.value()))
        finally:
            c.close()
        assert got == [(0, b"from-paused"), (1, b"new-0"), (2, b"new-1"), (3, b"new-2"),
                       (4, b"new-3")]
        assert leaders(bootstrap, "s")[0] == 3 - old  # the resumed broker did not take it back


def test_a_broker_shutting_down_hands_its_partitions_over_at_once(
    tmp_path: Path, metadata: str
) -> None:
    with cluster(tmp_path, metadata, 2) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "h", 2)
        placed: dict[int, int] = {}
        wait_for("one partition per broker", lambda: placed.update(leaders(bootstrap, "h"))
                 or sorted(placed.values()) == [1, 2])
        leaving, staying = node(brokers, placed[0]), node(brokers, 3 - placed[0])
        began = time.monotonic()
        leaving.stop()  # SIGTERM: flush, give up partitions and lease, exit
        wait_for("the other broker to lead both", lambda: leaders(staying.bootstrap, "h")
                 == {0: 3 - placed[0], 1: 3 - placed[0]}, timeout=15)
        moved = time.monotonic() - began
        print(f"\npartitions of a broker shut down were led again after {moved:.2f} s")
        assert moved < 2.5  # a heartbeat or two, not the session timeout
        p = Producer({"bootstrap.servers": staying.bootstrap, "acks": "all"})
        p.produce("h", value=b"after", partition=0)
        assert p.flush(TIMEOUT_S) == 0


def object_files(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "objects").rglob("*")
                  if p.is_file())


def test_a_joining_broker_takes_partitions_over_without_copying_a_byte(
    tmp_path: Path, metadata: str
) -> None:
    no_compaction = ("--set", "compaction.interval.ms=3600000")
    with cluster(tmp_path, metadata, 3, *no_compaction) as brokers:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "j", 8)
        placed: dict[int, int] = {}
        wait_for("8 partitions over 3 brokers", lambda: placed.update(leaders(bootstrap, "j"))
                 or sorted(Counter(placed.values()).values()) == [2, 3, 3])
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(80):
            p.produce("j", value=f"{i % 8}-{i // 8}".encode(), partition=i % 8)
        assert p.flush(TIMEOUT_S) == 0
        before = object_files(tmp_path)
        fourth = BrokerProcess(tmp_path / "b4", ["--node-id", "4", "--object-store",
                                                 (tmp_path / "objects").resolve().as_uri(),
                                                 "--metadata", metadata, *no_compaction])
        brokers.append(fourth.start())
        bootstrap = ",".join(b.bootstrap for b in brokers)
        wait_for("2 partitions per broker", lambda: placed.update(leaders(bootstrap, "j"))
                 or sorted(Counter(placed.values()).values()) == [2, 2, 2, 2])
        assert object_files(tmp_path) == before  # leadership moved, no object was written
        moved = sorted(q for q, n in placed.items() if n == 4)
        c = Consumer({"bootstrap.servers": fourth.bootstrap, "group.id": "j",
                      "enable.auto.commit": False})
        try:
            c.assign([TopicPartition("j", q, 0) for q in moved])
            got: set[bytes] = set()
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < 20 and time.monotonic() < deadline:
                for m in c.consume(num_messages=20, timeout=0.5):
                    if m.error() is None:
                        got.add(m.value())
        finally:
            c.close()
        assert got == {f"{q}-{k}".encode() for q in moved for k in range(10)}
        for q in moved:
            p.produce("j", value=b"on-4", partition=q)
        assert p.flush(TIMEOUT_S) == 0


def test_a_starting_broker_keeps_its_lease(tmp_path: Path, metadata: str) -> None:
    """Start-up work (loading every served response schema, freezing the heap: ~1 s, 3 s on a
    loaded machine) is done before the broker takes a lease, not between its first renewals:
    it made every broker's second renewal come 1.1-3.5 s after the first, past the 2 s
    session on a loaded machine, and others saw it leave and come back."""
    with cluster(tmp_path, metadata, 1) as (broker,):
        time.sleep(2.5)  # several renewals
        assert broker.proc is not None and broker.proc.poll() is None
        late = [line for line in broker.output if "lease renewed" in line]
        assert not late, late
