"""Topic configs that floe promises are applied, seen through real clients on a real broker
(local object store and S3): log compaction, keyless produce to a compacted topic,
compact+delete retention, compression.type, message.max.bytes, message.timestamp.*."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from broker.protocol import records
from broker.protocol.recordcodec import decode_records
from tests.brokerproc import BrokerProcess
from tests.integration.test_bad_input import create_topic, fetch
from tests.rawclient import RawClient
from tests.s3server import broker_on_s3

pytestmark = pytest.mark.integration

FAST = [
    "--set", "compaction.interval.ms=300", "--set", "compaction.min.age.ms=0",
    "--set", "objects.gc.delay.ms=500", "--set", "log.retention.check.interval.ms=300",
    "--set", "log.cleaner.backoff.ms=300",
]


@pytest.fixture(params=["file", "s3"])
def make_broker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., BrokerProcess]]:
    """Start a broker with extra flags, on the local object store or on S3 (moto)."""
    started: list[BrokerProcess] = []

    def start(*extra: str) -> BrokerProcess:
        args: list[str] = [*FAST, *extra]
        env: dict[str, str] = {}
        if request.param == "s3":
            s3_args, env = broker_on_s3(request.getfixturevalue("s3_server"), "floe-cfg")
            args += s3_args
        b = BrokerProcess(data_dir=tmp_path / "floe-data", extra_args=args, env=env).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


Log = list[tuple[int, bytes | None, bytes | None]]


def read_log(bootstrap: str, topic: str, start: int = 0) -> Log:
    """(offset, key, value) of every record of partition 0 from `start` to the high watermark."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cfg-check",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, start)])
        out: Log = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                return out
            out.append((m.offset(), m.key(), m.value()))
        raise AssertionError(f"did not reach the end of {topic}; got {len(out)} records")
    finally:
        c.close()


def produce(bootstrap: str, topic: str, items: list[tuple[bytes | None, bytes | None]],
            **conf: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """Produce in order; returns (offset, key, value) from the delivery reports."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    done: list[tuple[int, bytes | None, bytes | None]] = []
    errors: list[KafkaError] = []

    def report(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            done.append((msg.offset(), msg.key(), msg.value()))  # type: ignore[attr-defined]

    for key, value in items:
        p.produce(topic, key=key, value=value, on_delivery=report)
        p.poll(0)
    assert p.flush(30) == 0
    assert not errors, errors
    return sorted(done, key=lambda d: d[0])


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def stored_bytes(broker: BrokerProcess, topic: str) -> int:
    """Bytes of the topic's chunks in the metadata index (the same for both object stores)."""
    db = sqlite3.connect(broker.data_dir / "meta.db", timeout=10)
    try:
        (n,) = db.execute(
            "SELECT coalesce(sum(c.length), 0) FROM chunks c JOIN streams s USING (stream_id)"
            " JOIN kafka_partitions k USING (stream_id)"
            " WHERE k.topic=? AND s.deleted=0 AND c.last_offset >= s.start_offset", (topic,)
        ).fetchone()
        return int(n)
    finally:
        db.close()


def latest_per_key(written: Log) -> dict[bytes | None, tuple[int, bytes | None]]:
    out: dict[bytes | None, tuple[int, bytes | None]] = {}
    for off, k, v in written:
        out[k] = (off, v)
    return out


def as_map(log: Log) -> dict[bytes | None, tuple[int, bytes | None]]:
    return {k: (off, v) for off, k, v in log}


def updates(keys: int, rounds: int, delete_every: int) -> list[tuple[bytes | None, bytes | None]]:
    items: list[tuple[bytes | None, bytes | None]] = []
    for r in range(rounds):
        for k in range(keys):
            last = r == rounds - 1
            value = None if last and k % delete_every == 0 else b"v%d-%d" % (k, r) * 20
            items.append((b"key-%04d" % k, value))
    return items


def test_compacted_topic_keeps_the_latest_value_per_key(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: a librdkafka consumer from offset 0 of a compacted topic sees exactly the
    latest record of every key at the offset it was acknowledged at (offsets strictly
    increasing), tombstones until delete.retention.ms after the cleaning, then not; fewer
    bytes are stored; a fetch at a cleaned-away offset starts at the next surviving record."""
    broker = make_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("changelog", 1, 1, config={
        "cleanup.policy": "compact", "delete.retention.ms": "10000",
    })])["changelog"].result(10)
    written = produce(broker.bootstrap, "changelog", updates(200, 8, 5))
    latest = latest_per_key(written)
    payload = sum(len(k or b"") + len(v or b"") for _, k, v in written)
    state: dict[str, Log] = {}

    def cleaned() -> bool:
        state["log"] = read_log(broker.bootstrap, "changelog")
        return len(state["log"]) == len(latest)

    wait_until(cleaned, 40, "the cleaner to keep one record per key")
    log = state["log"]
    offsets = [off for off, _, _ in log]
    assert offsets == sorted(set(offsets))
    assert as_map(log) == latest
    assert any(v is None for _, _, v in log), "tombstones removed before delete.retention.ms"
    assert stored_bytes(broker, "changelog") < payload / 4
    gone = written[3][0]  # an early update, superseded
    assert gone not in offsets
    assert read_log(broker.bootstrap, "changelog", start=gone)[0][0] == min(
        o for o in offsets if o > gone
    )

    def tombstones_gone() -> bool:
        state["log"] = read_log(broker.bootstrap, "changelog")
        return all(v is not None for _, _, v in state["log"])

    wait_until(tombstones_gone, 40, "tombstones to be removed after delete.retention.ms")
    assert as_map(state["log"]) == {k: v for k, v in latest.items() if v[1] is not None}


def test_keyless_records_are_rejected_by_compacted_topics(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: producing a keyless record to a compacted topic fails with INVALID_RECORD
    (87) and appends nothing; keyed records and keyless records to other topics still work."""
    broker = make_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("cmp", 1, 1, config={"cleanup.policy": "compact"}),
                         NewTopic("plain", 1, 1)])["cmp"].result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
    errors: list[KafkaError | None] = []
    p.produce("cmp", value=b"no key", on_delivery=lambda err, _m: errors.append(err))
    assert p.flush(20) == 0
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w"})
    try:
        assert c.get_watermark_offsets(TopicPartition("cmp", 0), 10) == (0, 0)
    finally:
        c.close()
    produce(broker.bootstrap, "cmp", [(b"k", b"v")])
    produce(broker.bootstrap, "plain", [(None, b"v")])
    assert [(k, v) for _, k, v in read_log(broker.bootstrap, "cmp")] == [(b"k", b"v")]


def test_compact_delete_topics_are_cleaned_and_expire(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: cleanup.policy=compact,delete gets both: duplicates are cleaned away and
    retention.ms still moves the log start past expired records."""
    broker = make_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("both", 1, 1, config={
        "cleanup.policy": "compact,delete", "retention.ms": "12000",
    })])["both"].result(10)
    written = produce(broker.bootstrap, "both", updates(50, 4, 1000))
    wait_until(lambda: len(read_log(broker.bootstrap, "both")) == 50, 30, "cleaning")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w"})
    try:
        end = written[-1][0] + 1
        wait_until(lambda: c.get_watermark_offsets(TopicPartition("both", 0), 5) == (end, end),
                   40, "retention to expire every record")
    finally:
        c.close()


def test_sigkill_while_cleaning_loses_nothing(make_broker: Callable[..., BrokerProcess]) -> None:
    """Must survive: SIGKILLs at random moments while the cleaner works lose no key's latest
    record: after restarts and a final cleaning, a consumer from 0 sees exactly the latest
    record of every key at its acknowledged offset."""
    broker = make_broker("--set", "log.cleaner.backoff.ms=50")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("crashy", 1, 1, config={
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
    })])["crashy"].result(10)
    rng = random.Random(7)
    written: Log = []
    cleanings = 0
    for round_ in range(5):
        written += produce(broker.bootstrap, "crashy", [
            (b"key-%03d" % rng.randrange(150), b"r%d-%d" % (round_, i) * 50) for i in range(600)
        ])
        time.sleep(rng.uniform(0.3, 1.5))  # compaction and cleaning under way
        cleanings += broker.log().count("cleaned stream")
        broker.kill()
        broker.start()
    assert cleanings > 0, "the cleaner never ran before a kill"
    latest = latest_per_key(written)
    state: dict[str, Log] = {}

    def cleaned() -> bool:
        state["log"] = read_log(broker.bootstrap, "crashy")
        return len(state["log"]) == len(latest)

    wait_until(cleaned, 40, "the final cleaning")
    assert as_map(state["log"]) == latest


def test_compression_type_recompresses_batches(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: a topic with compression.type=zstd stores gzip-produced batches as zstd
    (and `producer` keeps gzip), and consumers read every record (keys, values, headers,
    timestamps) unchanged."""
    broker = make_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("z", 1, 1, config={"compression.type": "zstd"}),
                         NewTopic("asis", 1, 1)])["z"].result(10)
    items: list[tuple[bytes | None, bytes | None]] = [
        (b"k%d" % i, b"value %d " % i * 30) for i in range(500)
    ]
    for topic in ("z", "asis"):
        produce(broker.bootstrap, topic, items, **{"compression.codec": "gzip",
                                                   "linger.ms": "50"})
    with RawClient(broker.bootstrap) as rc:
        for topic, codec in (("z", 4), ("asis", 1)):
            data = fetch(rc, topic, 0).records  # type: ignore[attr-defined]
            headers = records.iter_headers(data)
            assert headers and {h.compression for h in headers} == {codec}
            got = [(r.key, r.value) for h in headers for r in decode_records(data, h)]
            assert got == items[: len(got)]
    for topic in ("z", "asis"):
        assert [(k, v) for _, k, v in read_log(broker.bootstrap, topic)] == items


def test_message_max_bytes_is_the_topic_default(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: the broker's message.max.bytes limits topics without max.message.bytes
    (MESSAGE_TOO_LARGE), a topic's own max.message.bytes wins, and DescribeConfigs shows the
    topic value with source STATIC_BROKER_CONFIG like Kafka."""
    broker = make_broker("--set", "message.max.bytes=3000")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("small", 1, 1),
                         NewTopic("big", 1, 1, config={"max.message.bytes": "20000"})]
                        )["small"].result(10)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "small")])
    entry = next(iter(described.values())).result(10)["max.message.bytes"]
    assert entry.value == "3000" and entry.source == ConfigSource.STATIC_BROKER_CONFIG.value
    with RawClient(broker.bootstrap) as c:  # CreateTopics v5+ answers with the same configs
        created = create_topic(c, "small-raw", configs={"compression.type": "zstd"})
    returned = {e.name: (e.value, e.config_source) for e in created.configs}
    assert returned["max.message.bytes"] == ("3000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert returned["compression.type"] == ("zstd", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    p = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
    errors: dict[str, KafkaError | None] = {}
    for topic in ("small", "big"):
        p.produce(topic, key=b"k", value=b"x" * 8000,
                  on_delivery=lambda err, m: errors.__setitem__(m.topic(), err))
    assert p.flush(20) == 0
    small_err = errors["small"]
    assert small_err is not None and small_err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert errors["big"] is None


def test_timestamp_bounds_reject_records_out_of_range(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: message.timestamp.before.max.ms / after.max.ms reject records whose
    CreateTime is too old / too far ahead with INVALID_TIMESTAMP; others go through."""
    broker = make_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("ts", 1, 1, config={
        "message.timestamp.before.max.ms": "60000", "message.timestamp.after.max.ms": "60000",
    })])["ts"].result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0, "linger.ms": 0})
    now = int(time.time() * 1000)
    results: dict[bytes, KafkaError | None] = {}
    for key, ts in ((b"old", now - 3_600_000), (b"future", now + 3_600_000), (b"ok", now)):
        p.produce("ts", key=key, value=b"v", timestamp=ts,
                  on_delivery=lambda err, m: results.__setitem__(m.key(), err))
        p.flush(20)
    for key in (b"old", b"future"):
        err = results[key]
        assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP, (key, err)
    assert results[b"ok"] is None
    assert [k for _, k, _ in read_log(broker.bootstrap, "ts")] == [b"ok"]


def _aiokafka_read(bootstrap: str, topic: str) -> Log:
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTP

    async def run() -> Log:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await c.start()
        try:
            tp = AioTP(topic, 0)
            c.assign([tp])
            c.seek(tp, 0)
            end = (await c.end_offsets([tp]))[tp]
            out: Log = []
            deadline = time.monotonic() + 30
            while await c.position(tp) < end:
                assert time.monotonic() < deadline, f"aiokafka stuck at {await c.position(tp)}"
                batch = await c.getmany(tp, timeout_ms=500)
                out += [(m.offset, m.key, m.value) for m in batch.get(tp, [])]
            return out
        finally:
            await c.stop()

    return asyncio.run(run())


def _kafka_python_read(bootstrap: str, topic: str) -> Log:
    import warnings

    with warnings.catch_warnings():  # kafka-python loads its schemas with a deprecated call
        warnings.filterwarnings("ignore", "open_text is deprecated", DeprecationWarning)
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KpTP

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = KpTP(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        end = c.end_offsets([tp])[tp]
        out: Log = []
        deadline = time.monotonic() + 30
        while c.position(tp) < end:
            assert time.monotonic() < deadline, f"kafka-python stuck at {c.position(tp)}"
            for msgs in c.poll(timeout_ms=500).values():
                out += [(m.offset, m.key, m.value) for m in msgs]
        return out
    finally:
        c.close()


@pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning")
def test_clients_read_past_a_fully_cleaned_tail(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: when the newest records of a compacted topic are tombstones that the
    cleaner removed (delete.retention.ms=0), librdkafka, aiokafka and kafka-python consumers
    starting at offset 0 still reach the high watermark (the cleaned tail is covered by an
    empty batch) and see exactly the surviving records."""
    broker = make_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("tail", 1, 1, config={
        "cleanup.policy": "compact", "delete.retention.ms": "0",
    })])["tail"].result(10)
    keep = produce(broker.bootstrap, "tail", [(b"keep-%d" % i, b"v") for i in range(10)])
    produce(broker.bootstrap, "tail", [(b"gone-%d" % i, b"v") for i in range(20)])
    produce(broker.bootstrap, "tail", [(b"gone-%d" % i, None) for i in range(20)])
    wait_until(lambda: len(read_log(broker.bootstrap, "tail")) == len(keep), 30,
               "tombstones and what they deleted to be cleaned away")
    assert read_log(broker.bootstrap, "tail") == keep
    assert _aiokafka_read(broker.bootstrap, "tail") == keep
    assert _kafka_python_read(broker.bootstrap, "tail") == keep


def test_tailing_consumer_during_cleaning_sees_every_latest_value(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Must survive: while a producer keeps updating keys and the cleaner and compaction keep
    swapping chunks, a consumer following the topic from offset 0 sees offsets strictly
    increasing and ends with exactly the latest value of every key (no surviving record
    skipped by a read racing a swap)."""
    broker = make_broker("--set", "log.cleaner.backoff.ms=100",
                         "--set", "compaction.interval.ms=200")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("live", 1, 1, config={
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
    })])["live"].result(10)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "live",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    c.assign([TopicPartition("live", 0, 0)])
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2})
    acked: dict[bytes, tuple[int, bytes]] = {}

    def report(err: KafkaError | None, m: object) -> None:
        assert err is None, err
        acked[m.key()] = (m.offset(), m.value())  # type: ignore[attr-defined]

    seen: dict[bytes, tuple[int, bytes]] = {}
    last_offset = -1
    try:
        deadline = time.monotonic() + 8
        i = 0
        while time.monotonic() < deadline:
            for _ in range(50):
                p.produce("live", key=b"k%02d" % (i % 40), value=b"v%d" % i, on_delivery=report)
                i += 1
            p.poll(0)
            m = c.poll(0.02)
            while m is not None:
                assert not m.error(), m.error()
                assert m.offset() > last_offset, (m.offset(), last_offset)
                last_offset = m.offset()
                seen[m.key()] = (m.offset(), m.value())
                m = c.poll(0)
        assert p.flush(30) == 0
        end = max(off for off, _ in acked.values()) + 1
        stop = time.monotonic() + 30
        while last_offset < end - 1 and time.monotonic() < stop:
            m = c.poll(0.2)
            if m is not None and not m.error():
                assert m.offset() > last_offset
                last_offset = m.offset()
                seen[m.key()] = (m.offset(), m.value())
        assert seen == acked
        assert "cleaned stream" in broker.log()
    finally:
        c.close()
