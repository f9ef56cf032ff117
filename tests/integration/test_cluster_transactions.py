"""Transactions over several brokers (issue 16 on the cluster of issue 12): a transactional id
is coordinated by the broker broker.cluster.coordinators places it on, whichever broker its
producer bootstraps to; the coordinator has markers written into partitions led by other
brokers (WriteTxnMarkers); SIGKILLed between transactions, its ids move and the producer goes
on with the new coordinator, and one SIGKILLed in PrepareCommit is completed by the next; a
transaction's offsets go to the group's coordinator, another broker, and become visible with
its output. Real `floe broker` processes on 127.0.0.1,
confluent_kafka clients, a SQLite or PostgreSQL metadata database."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from broker.client import Client, nested
from broker.cluster.coordinators import slot_of, slot_owner
from broker.errors import ErrorCode
from broker.txn import remote
from tests.brokerproc import BrokerProcess
from tests.integration.test_cluster import TIMEOUT_S, cluster, create_topic, leaders, wait_for
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 6
NOT_COORDINATOR = 16


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    return str(request.getfixturevalue("pg_url"))


def key_on(node_id: int, nodes: list[int], prefix: str) -> str:
    """A transactional id (or group id) the placement rule puts on `node_id`."""
    return next(k for k in (f"{prefix}-{i}" for i in range(10_000))
                if slot_owner(slot_of(k), nodes) == node_id)


def find_coordinator(bootstrap: str, tid: str) -> int:
    """The node FindCoordinator (key type 1, v4 batched and v1) names, asked of `bootstrap`;
    both versions must agree."""
    with Client(bootstrap, timeout=5) as c:
        batched = c.request(10, 4, key_type=1, coordinator_keys=(tid,))
        (entry,) = batched.coordinators
        single = c.request(10, 1, key=tid, key_type=1)
    assert entry.error_code == 0 and single.error_code == 0, (entry, single)
    assert entry.node_id == single.node_id
    return int(entry.node_id)


def fetched_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    """The group's committed offsets, OffsetFetch v7 without require_stable, asked of its
    coordinator `bootstrap` (what the coordinator holds now, no retry)."""
    topic_cls = nested(9, 7, "OffsetFetchRequestTopic")
    with Client(bootstrap, timeout=5) as c:
        r = c.request(9, 7, group_id=group, require_stable=False, topics=(
            topic_cls(name=topic, partition_indexes=tuple(range(partitions))),))
    assert r.error_code == 0, r
    (t,) = r.topics
    assert all(p.error_code == 0 for p in t.partitions), t
    return sorted(int(p.committed_offset) for p in t.partitions)


def describe_code(bootstrap: str, tid: str) -> int:
    with Client(bootstrap, timeout=5) as c:
        (state,) = c.request(65, 0, transactional_ids=(tid,)).transaction_states
    return int(state.error_code)


def listed(bootstrap: str) -> set[str]:
    with Client(bootstrap, timeout=5) as c:
        r = c.request(66, 0, state_filters=(), producer_id_filters=())
    assert r.error_code == 0
    return {s.transactional_id for s in r.transaction_states}


def spread_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    """Create the topic; wait until each partition has a leader and they are on 2+ brokers."""
    create_topic(bootstrap, topic, partitions)
    found: dict[int, int] = {}

    def placed() -> bool:
        found.update(leaders(bootstrap, topic))
        return len(found) == partitions and min(found.values()) > 0 and len(
            set(found.values())) >= 2

    wait_for(f"{topic}'s partitions led by several brokers", placed)
    return found


def txn_producer(bootstrap: str, tid: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                  "transaction.timeout.ms": 20000, "message.timeout.ms": 20000})
    p.init_transactions(TIMEOUT_S)
    return p


def read_all(bootstrap: str, topic: str, isolation: str,
             partitions: int = PARTITIONS) -> list[bytes]:
    """Every record's value up to the end of each partition (sorted)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4()}",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue  # a leader moving: the consumer goes on
            eof.discard(m.partition())
            out.append(m.value())
    finally:
        c.close()
    assert len(eof) == partitions, "did not reach the end of every partition"
    return sorted(out)


def one_transaction(p: Producer, topic: str, tag: str, commit: bool) -> None:
    p.begin_transaction()
    for part in range(PARTITIONS):
        p.produce(topic, value=f"{tag}-{part}".encode(), partition=part)
    if commit:
        p.commit_transaction(TIMEOUT_S)
    else:
        p.flush(TIMEOUT_S)  # written, then aborted (an abort drops what was not sent yet)
        p.abort_transaction(TIMEOUT_S)


def expected(*tags: str) -> list[bytes]:
    return sorted(f"{t}-{p}".encode() for t in tags for p in range(PARTITIONS))


def test_a_transaction_spans_partitions_led_by_every_broker(
    tmp_path: Path, metadata: str
) -> None:
    with cluster(tmp_path, metadata, 3) as brokers:
        all_boot = ",".join(b.bootstrap for b in brokers)
        spread_topic(all_boot, "tx")
        tid = key_on(2, [1, 2, 3], "txn")
        wait_for("every broker to name broker 2 as the coordinator", lambda: all(
            find_coordinator(b.bootstrap, tid) == 2 for b in brokers))
        p = txn_producer(brokers[0].bootstrap, tid)  # bootstrapped to broker 1
        one_transaction(p, "tx", "c1", commit=True)
        one_transaction(p, "tx", "a2", commit=False)
        one_transaction(p, "tx", "c3", commit=True)
        p.begin_transaction()
        p.produce("tx", value=b"open-0", partition=0)  # left open: read_committed stops
        p.flush(TIMEOUT_S)
        # the coordinator describes it; the others answer NOT_COORDINATOR, list nothing
        assert describe_code(brokers[1].bootstrap, tid) == 0
        assert describe_code(brokers[0].bootstrap, tid) == NOT_COORDINATOR
        assert describe_code(brokers[2].bootstrap, tid) == NOT_COORDINATOR
        assert tid in listed(brokers[1].bootstrap)
        assert tid not in listed(brokers[0].bootstrap) | listed(brokers[2].bootstrap)
        p.abort_transaction(TIMEOUT_S)
        assert read_all(all_boot, "tx", "read_committed") == expected("c1", "c3")
        assert read_all(all_boot, "tx", "read_uncommitted") == sorted(
            [*expected("c1", "a2", "c3"), b"open-0"])

        # WriteTxnMarkers' guards: a partition the broker does not lead; a marker of an epoch
        # older than the partition has seen (a new instance of the id wrote there since)
        p2 = txn_producer(brokers[2].bootstrap, tid)  # epoch bumped: p is fenced
        one_transaction(p2, "tx", "c4", commit=True)
        with Client(brokers[1].bootstrap, timeout=5) as c:
            (state,) = c.request(65, 0, transactional_ids=(tid,)).transaction_states
        pid, epoch = int(state.producer_id), int(state.producer_epoch)
        assert epoch >= 1
        for part, lead in leaders(all_boot, "tx").items():
            other = next(b for n, b in enumerate(brokers, 1) if n != lead)
            marker = remote.Marker(pid, epoch - 1, False, 0, (("tx", part),))
            assert remote.send(other.bootstrap, [marker]) == {
                (pid, "tx", part): ErrorCode.not_leader_or_follower}
            assert remote.send(brokers[lead - 1].bootstrap, [marker]) == {
                (pid, "tx", part): ErrorCode.invalid_producer_epoch}
        assert read_all(all_boot, "tx", "read_committed") == expected("c1", "c3", "c4")


def _retrying(p_box: list[Producer], bootstrap: str, tid: str,
              body: Callable[[Producer], None]) -> int:
    """Run a transaction `body` until it commits, as an application does: an abortable error
    aborts and retries, a fatal one makes a new producer (InitProducerId again). The
    attempts taken."""
    deadline = time.monotonic() + 60
    attempts = 0
    while True:
        attempts += 1
        p = p_box[0]
        try:
            body(p)
            return attempts
        except KafkaException as e:
            err: Any = e.args[0]
            if time.monotonic() > deadline:
                raise
            if err.fatal():
                p_box[0] = txn_producer(bootstrap, tid)
            elif err.txn_requires_abort():
                try:
                    p.abort_transaction(TIMEOUT_S)
                except KafkaException:
                    p_box[0] = txn_producer(bootstrap, tid)
            time.sleep(0.2)


def test_the_coordinator_sigkilled_between_transactions(tmp_path: Path, metadata: str) -> None:
    with cluster(tmp_path, metadata, 3) as brokers:
        all_boot = ",".join(b.bootstrap for b in brokers)
        spread_topic(all_boot, "tx")
        tid = key_on(3, [1, 2, 3], "txn")
        survivor = slot_owner(slot_of(tid), [1, 2])
        wait_for("every broker to name broker 3", lambda: all(
            find_coordinator(b.bootstrap, tid) == 3 for b in brokers))
        box = [txn_producer(brokers[0].bootstrap, tid)]
        one_transaction(box[0], "tx", "c1", commit=True)
        one_transaction(box[0], "tx", "a2", commit=False)
        brokers[2].kill()  # SIGKILL
        live: list[BrokerProcess] = brokers[:2]
        wait_for(f"broker {survivor} named the coordinator by both survivors", lambda: all(
            find_coordinator(b.bootstrap, tid) == survivor for b in live))

        def commit_c3(p: Producer) -> None:
            p.begin_transaction()
            for part in range(PARTITIONS):
                p.produce("tx", value=f"c3-{part}".encode(), partition=part)
            while True:  # a retriable error: the commit is asked again, as librdkafka says
                try:
                    p.commit_transaction(TIMEOUT_S)
                    return
                except KafkaException as e:
                    if not e.args[0].retriable():
                        raise

        _retrying(box, brokers[0].bootstrap, tid, commit_c3)
        one_transaction(box[0], "tx", "c4", commit=True)
        boot = ",".join(b.bootstrap for b in live)
        got = read_all(boot, "tx", "read_committed")
        assert got == expected("c1", "c3", "c4")
        assert describe_code(brokers[survivor - 1].bootstrap, tid) == 0


def test_offsets_and_output_commit_together_across_coordinators(
    tmp_path: Path, metadata: str
) -> None:
    """consume-transform-produce: the group's coordinator (broker 1) is not the transaction's
    (broker 3); the producer bootstraps to broker 2. Committed offsets appear with the output,
    an aborted round's offsets and output never."""
    with cluster(tmp_path, metadata, 3) as brokers:
        all_boot = ",".join(b.bootstrap for b in brokers)
        spread_topic(all_boot, "in", 3)
        spread_topic(all_boot, "out", 3)
        group = key_on(1, [1, 2, 3], "ctp-group")
        tid = key_on(3, [1, 2, 3], "ctp-txn")
        wait_for("placements seen by every broker", lambda: all(
            find_coordinator(b.bootstrap, tid) == 3 for b in brokers))
        plain = Producer({"bootstrap.servers": all_boot})
        for i in range(30):
            plain.produce("in", value=b"%d" % i, partition=i % 3)
        plain.flush(TIMEOUT_S)
        p = txn_producer(brokers[1].bootstrap, tid)

        def committed() -> list[int]:
            c = Consumer({"bootstrap.servers": brokers[1].bootstrap, "group.id": group})
            try:
                tps = c.committed([TopicPartition("in", i) for i in range(3)], timeout=10)
            finally:
                c.close()
            return [max(tp.offset, -1) for tp in tps]

        def one_round(n: int, commit: bool) -> list[int]:
            c = Consumer({"bootstrap.servers": brokers[1].bootstrap, "group.id": group,
                          "enable.auto.commit": False, "auto.offset.reset": "earliest",
                          "isolation.level": "read_committed"})
            c.subscribe(["in"])
            try:
                p.begin_transaction()
                taken = 0
                deadline = time.monotonic() + TIMEOUT_S
                while taken < n and time.monotonic() < deadline:
                    m = c.poll(0.5)
                    if m is None or m.error():
                        continue
                    p.produce("out", value=b"x" + m.value(), partition=m.partition())
                    taken += 1
                assert taken == n
                positions = c.position(c.assignment())
                p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
                if commit:
                    p.commit_transaction(TIMEOUT_S)
                else:
                    p.abort_transaction(TIMEOUT_S)
                return sorted(max(tp.offset, -1) for tp in positions)  # -1: none
            finally:
                c.close()

        first = one_round(9, commit=True)
        # at once after the commit, the group's coordinator (broker 1) answers the new offsets
        assert fetched_offsets(brokers[0].bootstrap, group, "in", 3) == first
        assert sorted(committed()) == first
        one_round(6, commit=False)
        assert sorted(committed()) == first  # the aborted round's offsets dropped
        out_after_first = read_all(all_boot, "out", "read_committed", 3)
        assert len(out_after_first) == 9
        last = one_round(21, commit=True)
        assert sum(o for o in last if o > 0) == 30
        assert fetched_offsets(brokers[0].bootstrap, group, "in", 3) == last
        assert sorted(committed()) == last
        out = read_all(all_boot, "out", "read_committed", 3)
        assert out == sorted(b"x%d" % i for i in range(30))  # every input once


def test_a_late_marker_of_a_coordinator_that_lost_the_id_is_refused(
    tmp_path: Path, metadata: str
) -> None:
    """Broker 3 coordinates the id (coordinator epoch 0: it created it) and commits c1; it is
    SIGKILLed, the survivor takes the id over (a higher coordinator epoch) and commits c2
    with it; the producer begins its next transaction. A marker broker 3 had on the wire
    (coordinator epoch 0, the producer's current epoch) reaching each partition's leader now
    is refused with TRANSACTION_COORDINATOR_FENCED (the leaders of the partitions broker 3
    led read the epochs from the log) and ends nothing: read_committed sees c1 and c2, the
    open transaction aborts as the producer says."""
    with cluster(tmp_path, metadata, 3) as brokers:
        all_boot = ",".join(b.bootstrap for b in brokers)
        spread_topic(all_boot, "tx")
        tid = key_on(3, [1, 2, 3], "txn")
        survivor = slot_owner(slot_of(tid), [1, 2])
        wait_for("every broker to name broker 3", lambda: all(
            find_coordinator(b.bootstrap, tid) == 3 for b in brokers))
        box = [txn_producer(brokers[0].bootstrap, tid)]
        one_transaction(box[0], "tx", "c1", commit=True)
        brokers[2].kill()  # SIGKILL
        live: list[BrokerProcess] = brokers[:2]
        boot = ",".join(b.bootstrap for b in live)
        wait_for(f"broker {survivor} named the coordinator by both survivors", lambda: all(
            find_coordinator(b.bootstrap, tid) == survivor for b in live))

        def commit_c2(p: Producer) -> None:
            p.begin_transaction()
            for part in range(PARTITIONS):
                p.produce("tx", value=f"c2-{part}".encode(), partition=part)
            while True:
                try:
                    p.commit_transaction(TIMEOUT_S)
                    return
                except KafkaException as e:
                    if not e.args[0].retriable():
                        raise

        _retrying(box, brokers[0].bootstrap, tid, commit_c2)
        p = box[0]
        p.begin_transaction()
        for part in range(PARTITIONS):
            p.produce("tx", value=f"open-{part}".encode(), partition=part)
        p.flush(TIMEOUT_S)
        with Client(live[survivor - 1].bootstrap, timeout=5) as c:
            (state,) = c.request(65, 0, transactional_ids=(tid,)).transaction_states
        assert state.error_code == 0 and state.transaction_state == "Ongoing", state
        pid, epoch = int(state.producer_id), int(state.producer_epoch)
        placed = wait_for_leaders(boot, live)
        for part, lead in placed.items():
            late = remote.Marker(pid, epoch, True, 0, (("tx", part),))
            assert remote.send(live[lead - 1].bootstrap, [late]) == {
                (pid, "tx", part): ErrorCode.transaction_coordinator_fenced}
        assert read_all(boot, "tx", "read_committed") == expected("c1", "c2")
        p.abort_transaction(TIMEOUT_S)
        assert read_all(boot, "tx", "read_committed") == expected("c1", "c2")
        assert read_all(boot, "tx", "read_uncommitted") == sorted(
            [*expected("c1", "c2"), *(f"open-{part}".encode() for part in range(PARTITIONS))])


def wait_for_leaders(bootstrap: str, live: list[BrokerProcess]) -> dict[int, int]:
    """Each partition's leader, once every one is a live broker."""
    found: dict[int, int] = {}

    def led() -> bool:
        found.clear()
        found.update(leaders(bootstrap, "tx"))
        return len(found) == PARTITIONS and all(1 <= n <= len(live) for n in found.values())

    wait_for("every partition led by a live broker", led)
    return found


def _row_state(db: Path, tid: str) -> str | None:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as c:
        row = c.execute("SELECT state FROM kafka_transactions WHERE transactional_id=?",
                        (tid,)).fetchone()
    return None if row is None else str(row[0])


def test_a_prepared_commit_is_completed_by_the_next_coordinator(tmp_path: Path) -> None:
    """The coordinator (broker 3) is SIGKILLed after writing PrepareCommit while a partition's
    leader (broker 2, SIGSTOPped) has not taken its marker yet: the id's next coordinator
    reads PrepareCommit from the database and writes the missing markers; the producer's
    commit (retried by librdkafka with the new coordinator) succeeds, read_committed sees the
    transaction on every partition exactly once."""
    db = (tmp_path / "meta.db").resolve()
    with cluster(tmp_path, f"sqlite:///{db}", 3) as brokers:
        all_boot = ",".join(b.bootstrap for b in brokers)
        spread_topic(all_boot, "tx")
        wait_for("broker 2 to lead a partition", lambda: 2 in leaders(all_boot, "tx").values())
        tid = key_on(3, [1, 2, 3], "txn")
        nxt = slot_owner(slot_of(tid), [1, 2])
        wait_for("every broker to name broker 3", lambda: all(
            find_coordinator(b.bootstrap, tid) == 3 for b in brokers))
        p = txn_producer(brokers[0].bootstrap, tid)
        one_transaction(p, "tx", "c1", commit=True)
        p.begin_transaction()
        for part in range(PARTITIONS):
            p.produce("tx", value=f"c2-{part}".encode(), partition=part)
        p.flush(TIMEOUT_S)
        paused = brokers[1].proc
        assert paused is not None
        paused.send_signal(signal.SIGSTOP)  # its marker cannot be written now
        outcome: list[BaseException | None] = []

        def commit() -> None:
            try:
                p.commit_transaction(60)
                outcome.append(None)
            except BaseException as e:  # reported below
                outcome.append(e)

        committer = threading.Thread(target=commit)
        committer.start()
        try:
            wait_for("PrepareCommit written", lambda: _row_state(db, tid) == "PrepareCommit",
                     timeout=10)
            time.sleep(0.3)
            brokers[2].kill()  # the coordinator, markers still missing on broker 2
            assert _row_state(db, tid) == "PrepareCommit"
        finally:
            paused.send_signal(signal.SIGCONT)
        committer.join(90)
        assert not committer.is_alive()
        assert outcome == [None], outcome
        wait_for("CompleteCommit", lambda: _row_state(db, tid) == "CompleteCommit")
        live = ",".join(b.bootstrap for b in brokers[:2])
        assert find_coordinator(brokers[0].bootstrap, tid) == nxt
        assert read_all(live, "tx", "read_committed") == expected("c1", "c2")


def test_an_open_transaction_goes_on_with_the_next_coordinator(
    tmp_path: Path, metadata: str
) -> None:
    """The coordinator SIGKILLed with a transaction Ongoing (records written to every
    partition): the next coordinator reads it from the database, the producer adds more and
    commits there (an attempt librdkafka has to abort is aborted: its records never show)."""
    with cluster(tmp_path, metadata, 3) as brokers:
        all_boot = ",".join(b.bootstrap for b in brokers)
        spread_topic(all_boot, "tx")
        tid = key_on(3, [1, 2, 3], "txn")
        wait_for("every broker to name broker 3", lambda: all(
            find_coordinator(b.bootstrap, tid) == 3 for b in brokers))
        box = [txn_producer(brokers[0].bootstrap, tid)]
        one_transaction(box[0], "tx", "c1", commit=True)
        tags: list[str] = []

        def open_then_commit(p: Producer) -> None:
            tag = f"m{len(tags)}"
            tags.append(tag)
            p.begin_transaction()
            for part in range(PARTITIONS):
                p.produce("tx", value=f"{tag}-{part}".encode(), partition=part)
            p.flush(TIMEOUT_S)
            if len(tags) == 1:
                brokers[2].kill()  # the coordinator, the transaction Ongoing
            for part in range(PARTITIONS):
                p.produce("tx", value=f"{tag}-{part}b".encode(), partition=part)
            while True:
                try:
                    p.commit_transaction(TIMEOUT_S)
                    return
                except KafkaException as e:
                    if not e.args[0].retriable():
                        raise

        _retrying(box, brokers[0].bootstrap, tid, open_then_commit)
        print(f"attempts: {tags}")
        live = ",".join(b.bootstrap for b in brokers[:2])
        done = tags[-1]
        assert read_all(live, "tx", "read_committed") == sorted(
            [*expected("c1", done), *(f"{done}-{p}b".encode() for p in range(PARTITIONS))])
