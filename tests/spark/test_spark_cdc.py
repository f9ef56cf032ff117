"""A Debezium CDC stream through a real broker into an upsert table topic (tabletopic.upsert),
read back in Spark SQL: inserts, updates and deletes over 10,000 keys (keys changed many times
within one commit and across commits, deleted keys inserted again, Debezium's tombstones after
deletes), the broker SIGKILLed in the middle (right after a burst the writer has read but not
yet committed: commits come every 4 s) and restarted on the same data directory. The
table's `SELECT *` must equal the final state computed here, row for row, and pyiceberg must
agree; the table's offsets end at the topic's end (nothing applied twice, nothing skipped)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.contract import table_offsets
from tests.brokerproc import BrokerProcess
from tests.spark.conftest import SparkEnv

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
KEYS = 10_000
TOPIC = "shop.accounts"
IDENT = ("cdc", "shop_accounts")
Row = dict[str, Any]


def stream(rng: random.Random, events: int, state: dict[int, Row], ts: int) -> list[
    tuple[int, bytes | None, bytes]
]:
    """`events` Debezium change events (partition, value, key) applied to `state` as they go:
    first every key inserted, then updates (hot keys most), deletes (each followed by a
    tombstone), and deleted keys created again."""
    out: list[tuple[int, bytes | None, bytes]] = []
    for n in range(events):
        k = rng.randrange(200) if rng.random() < 0.3 else rng.randrange(KEYS)
        before = state.get(k)
        if before is None:
            op, after = "c", {"id": k, "name": f"n{k}-{n}", "balance": n}
        elif rng.random() < 0.1:
            op, after = "d", None
        else:
            op, after = "u", {**before, "name": f"n{k}-{n}", "balance": before["balance"] + n}
        value = {"op": op, "before": before, "after": after, "ts_ms": ts + n,
                 "source": {"db": "shop", "table": "accounts"}}
        key = json.dumps({"id": k}).encode()
        out.append((k % 2, json.dumps(value).encode(), key))
        if after is None:
            state.pop(k)
            out.append((k % 2, None, key))  # Debezium's tombstone: invalid here, to the DLQ
        else:
            state[k] = after
    return out


def produce(bootstrap: str, events: list[tuple[int, bytes | None, bytes]],
            ends: dict[int, int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    for part, value, key in events:
        p.produce(TOPIC, value, key=key, partition=part, on_delivery=delivered)
        p.poll(0)
    assert p.flush(60) == 0 and not errors, errors[:3]


def offsets_now(env: SparkEnv) -> dict[int, int]:
    try:
        return table_offsets(env.catalog.load_table(IDENT))
    except Exception:  # no table yet
        return {}


def wait_offsets(env: SparkEnv, want: dict[int, int] | int, timeout: float) -> None:
    """Until the table's offsets equal `want` (an int: until they add up to at least it)."""
    deadline = time.monotonic() + timeout
    got: dict[int, int] = {}
    while time.monotonic() < deadline:
        got = offsets_now(env)
        if got == want or (isinstance(want, int) and sum(got.values()) >= want):
            return
        time.sleep(0.05)
    raise AssertionError(f"table offsets {got}, waiting for {want}")


def test_debezium_upserts_survive_sigkill(spark_env: SparkEnv) -> None:
    env = spark_env
    rng = random.Random(15)
    state: dict[int, Row] = {}
    first = stream(rng, 20_000, state, 0)
    second = stream(rng, 10_000, state, 10**6)
    ends: dict[int, int] = {}
    broker = BrokerProcess(data_dir=env.data_dir).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(
            TOPIC, 2, 1, config={
                "table.topic.enable": "true", "table.topic.convert.value.type": "json",
                "table.topic.transform.value.type": "flatten_debezium",
                "table.topic.namespace": "cdc", "table.topic.upsert.enable": "true",
                "table.topic.id.columns": "[id]",
                "table.topic.commit.interval.ms": "4000"})])[TOPIC].result(10)
        produce(broker.bootstrap, first, ends)
        wait_offsets(env, 1, 60)  # a commit landed: the next is due 4 s later
        produce(broker.bootstrap, second, ends)
        broker.kill()  # mid-stream: the writer holds converted rows it has not committed
        partial = offsets_now(env)
        assert partial != ends, "everything was committed before the kill: nothing tested"
        broker.start()
        produce(broker.bootstrap, stream(rng, 20_000, state, 2 * 10**6), ends)
        wait_offsets(env, ends, 120)
    finally:
        broker.stop()

    expected = sorted((r["id"], r["name"], r["balance"]) for r in state.values())
    assert 5_000 < len(expected) < KEYS
    rows = [r.asDict(recursive=True) for r in
            env.spark.sql("SELECT * FROM floe.cdc.shop_accounts").collect()]
    assert sorted((r["id"], r["name"], r["balance"]) for r in rows) == expected
    assert all(r["_cdc"]["op"] in ("I", "U") for r in rows)
    arrow = env.catalog.load_table(IDENT).scan(selected_fields=("id", "name", "balance"))
    assert sorted(tuple(r.values()) for r in arrow.to_arrow().to_pylist()) == expected
