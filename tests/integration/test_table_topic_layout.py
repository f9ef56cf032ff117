"""partition.by / sort.by / upsert through a real broker: a bad spec is INVALID_CONFIG naming
the problem at CreateTopics and at IncrementalAlterConfigs; a JSON table topic partitioned by
identity(region) is re-partitioned live by bucket(id, 4) (IncrementalAlterConfigs) and keeps
both layouts; a JSON upsert topic without a cdc field keeps the latest row per id."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.brokerproc import BrokerProcess
from tests.integration.test_table_topic import catalog, create_table_topic, start

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, docs: list[dict[str, object]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for d in docs:
        p.produce(topic, json.dumps(d).encode(), partition=0)
    assert p.flush(20) == 0


def wait_offset(data: Path, table: str, end: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    got: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            got = dict(catalog(data).load_table(("default", table)).properties)
        except Exception:
            got = {}
        if json.loads(got.get("floe.offsets", "{}")).get("0") == end:
            return
        time.sleep(0.1)
    raise AssertionError(f"{table}: floe.offsets {got.get('floe.offsets')}, waiting for {end}")


def alter(admin: AdminClient, topic: str, **cfg: str) -> None:
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in cfg.items()])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(10)


def test_layout_configs_through_the_broker(tmp_path: Path) -> None:
    broker: BrokerProcess = start(tmp_path)
    data = tmp_path / "data"
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        bad = NewTopic("bad", 1, 1, config={"table.topic.enable": "true",
                                            "table.topic.partition.by": "[bucket(id)]"})
        with pytest.raises(KafkaException) as e:
            admin.create_topics([bad])["bad"].result(10)
        err = e.value.args[0]
        assert err.code() == KafkaError.INVALID_CONFIG and "bucket(id, N)" in err.str()

        create_table_topic(broker.bootstrap, "events", 1, **{
            "table.topic.partition.by": "[identity(region)]",
            "table.topic.commit.interval.ms": "300"})
        with pytest.raises(KafkaException) as e:
            alter(admin, "events", **{"table.topic.sort.by": "[id sideways]"})
        assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert "cannot parse 'id sideways'" in e.value.args[0].str()

        produce(broker.bootstrap, "events", [{"id": i, "region": f"r{i % 3}"} for i in range(30)])
        wait_offset(data, "events", 30)
        alter(admin, "events", **{"table.topic.partition.by": "[bucket(id, 4)]",
                                  "table.topic.sort.by": "[id desc]"})
        produce(broker.bootstrap, "events", [{"id": i, "region": None} for i in range(30, 60)])
        wait_offset(data, "events", 60)
        table = catalog(data).load_table(("default", "events"))
        files = table.inspect.files().to_pylist()
        assert {f["spec_id"] for f in files} == {1, 2}
        assert {f["partition"]["region"] for f in files if f["spec_id"] == 1} == {"r0", "r1", "r2"}
        assert len({f["partition"]["id_bucket_4"] for f in files if f["spec_id"] == 2}) == 4
        assert [str(f.transform) for f in table.sort_order().fields] == ["identity"]
        assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(60))

        create_table_topic(broker.bootstrap, "users", 1, **{
            "table.topic.upsert.enable": "true", "table.topic.id.columns": "[id]",
            "table.topic.commit.interval.ms": "300"})
        produce(broker.bootstrap, "users", [{"id": i % 10, "v": i} for i in range(100)])
        wait_offset(data, "users", 100)
        rows = catalog(data).load_table(("default", "users")).scan().to_arrow().to_pylist()
        assert sorted((r["id"], r["v"]) for r in rows) == [(i, 90 + i) for i in range(10)]
    finally:
        broker.stop()
