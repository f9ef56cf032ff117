"""Idempotent producers: retries after lost responses write nothing twice, sequence errors are
Kafka's, and the bookkeeping survives a broker SIGKILL."""

from __future__ import annotations

import datetime
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.integration.test_bad_input import create_topic, fetch, produce
from tests.rawclient import RawClient, make_batch, request_class
from tests.tcpproxy import LossyProxy

pytestmark = pytest.mark.integration
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47


def read_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF
                eof.add(m.partition())
                continue
            eof.discard(m.partition())
            out.append(m.value())
    finally:
        c.close()
    assert len(eof) == partitions
    return out


def test_lost_produce_responses_do_not_duplicate(tmp_path: Path) -> None:
    seen = Counter[int]()

    def drop(api_key: int) -> bool:  # lose every 7th produce response, 6 times in all
        if api_key != 0:
            return False
        seen[0] += 1
        return seen[0] % 7 == 0 and seen[0] <= 42

    broker = BrokerProcess(data_dir=tmp_path / "d")
    proxy: LossyProxy | None = None
    try:
        broker.start()
        proxy = LossyProxy((broker.host, broker.port), drop).start()
        broker.stop()  # restart advertising the proxy, so every client connection crosses it
        broker.extra_args = ["--advertised", f"127.0.0.1:{proxy.port}"]
        broker.start()
        proxy.upstream = (broker.host, broker.port)
        via_proxy = f"127.0.0.1:{proxy.port}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("exactly", 3, 1)])["exactly"].result(10)
        errors: list[str] = []
        p = Producer({"bootstrap.servers": via_proxy, "enable.idempotence": True,
                      "linger.ms": 5, "batch.num.messages": 200, "request.timeout.ms": 5000,
                      "message.timeout.ms": 60000})
        n = 20_000
        for i in range(n):
            p.produce("exactly", f"rec-{i}".encode(), partition=i % 3,
                      on_delivery=lambda e, _m: errors.append(str(e)) if e else None)
            if i % 500 == 0:
                p.poll(0)
        assert p.flush(90) == 0
        assert not errors, errors[:3]
        assert proxy.dropped >= 3, "the proxy did not lose any response"
        values = read_values(broker.bootstrap, "exactly", 3)
        counts = Counter(values)
        dupes = [v for v, c in counts.items() if c > 1]
        assert not dupes, f"{len(dupes)} records written twice, e.g. {dupes[:3]}"
        assert set(counts) == {f"rec-{i}".encode() for i in range(n)}
    finally:
        if proxy is not None:
            proxy.stop()
        broker.stop()


def init_pid(c: RawClient) -> tuple[int, int]:
    r = c.request(request_class(22, 4)(transactional_id=None,
                                       transaction_timeout=datetime.timedelta(seconds=60),
                                       producer_id=-1, producer_epoch=-1))
    assert r.error_code == 0
    return r.producer_id, r.producer_epoch


def test_sequence_rules_and_restart(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as c:
        assert create_topic(c, "seq").error_code == 0
        pid, epoch = init_pid(c)
        b0 = make_batch([b"a", b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        b1 = make_batch([b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=2)
        gap = make_batch([b"x"], producer_id=pid, producer_epoch=epoch, base_sequence=9)
        assert produce(c, "seq", {0: b0})[0].base_offset == 0
        assert produce(c, "seq", {0: b1})[0].base_offset == 2
        again = produce(c, "seq", {0: b0})[0]  # a retry of an earlier batch
        assert (again.error_code, again.base_offset) == (0, 0)
        assert produce(c, "seq", {0: gap})[0].error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert fetch(c, "seq", 0).high_watermark == 3
    broker.kill()
    broker.start()
    with RawClient(broker.bootstrap) as c:
        retry = produce(c, "seq", {0: b1})[0]  # the retry arrives after a crash
        assert (retry.error_code, retry.base_offset) == (0, 2)
        assert fetch(c, "seq", 0).high_watermark == 3
        nxt = make_batch([b"d"], producer_id=pid, producer_epoch=epoch, base_sequence=3)
        assert produce(c, "seq", {0: nxt})[0].base_offset == 3
        # a newer epoch fences the old one
        newer = make_batch([b"e"], producer_id=pid, producer_epoch=epoch + 1, base_sequence=0)
        assert produce(c, "seq", {0: newer})[0].base_offset == 4
        stale = make_batch([b"f"], producer_id=pid, producer_epoch=epoch, base_sequence=4)
        assert produce(c, "seq", {0: stale})[0].error_code == INVALID_PRODUCER_EPOCH
        pid2, _ = init_pid(c)
        assert pid2 != pid
