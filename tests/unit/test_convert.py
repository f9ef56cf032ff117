from __future__ import annotations

import json

import pyarrow as pa

from broker.protocol.recordcodec import Record
from tabletopic.config import TableTopicConfig, default_table_name
from tabletopic.convert import KAFKA_TYPE, Converter


def rec(i: int, value: bytes | None, key: bytes | None = b"k") -> Record:
    return Record(i, 1_700_000_000_000 + i, key, value, (("h", b"v"),))


def j(d: object) -> bytes:
    return json.dumps(d).encode()


def test_json_columns_are_inferred_and_evolve() -> None:
    c = Converter("json")
    t1, bad = c.convert(0, [rec(0, j({"id": 1, "name": "a"})), rec(1, j({"id": 2, "x": None}))])
    assert not bad and t1 is not None
    assert t1.schema.field("_kafka").type == KAFKA_TYPE
    assert t1.column_names == ["_kafka", "id", "name"]  # null alone makes no column
    t2, bad = c.convert(0, [rec(2, j({"id": 3, "score": 1.5, "nested": {"a": [1, 2]}}))])
    assert not bad and t2 is not None
    assert t2.schema.field("nested").type == pa.struct([("a", pa.list_(pa.int64()))])
    assert t2.to_pylist()[0]["name"] is None
    row = t1.to_pylist()[0]
    assert row["_kafka"]["offset"] == 0 and row["_kafka"]["headers"] == [
        {"key": "h", "value": b"v"}
    ]


def test_conflicts_and_garbage_are_invalid_but_the_rest_goes_on() -> None:
    c = Converter("json")
    records = [
        rec(0, j({"id": 1, "score": 2.5})),
        rec(1, j({"id": "one"})),
        rec(2, b"{oops"),
        rec(3, j([1, 2])),
        rec(4, j({"_kafka": 1})),
        rec(5, j({"id": 2, "score": 3})),
        rec(6, None),
    ]
    table, bad = c.convert(0, records)
    assert table is not None
    assert [b.record.offset for b in bad] == [1, 2, 3, 4]
    assert [r["_kafka"]["offset"] for r in table.to_pylist()] == [0, 5, 6]
    assert table.to_pylist()[1]["score"] == 3.0  # an integer widens into a double column


def test_known_table_schema_is_respected() -> None:
    known = pa.schema(
        [
            pa.field("_kafka", KAFKA_TYPE),
            pa.field("id", pa.int64()),
            pa.field("name", pa.large_string()),
        ]
    )
    c = Converter("json", known)
    table, bad = c.convert(1, [rec(0, j({"id": 1.5})), rec(1, j({"name": "x"}))])
    assert [b.record.offset for b in bad] == [0]
    assert table is not None and table.to_pylist()[0]["name"] == "x"


def test_raw_and_string_values() -> None:
    raw, bad = Converter("raw").convert(0, [rec(0, b"\xff\x00"), rec(1, None)])
    assert raw is not None and not bad and raw.column("value").to_pylist() == [b"\xff\x00", None]
    text, bad = Converter("string").convert(0, [rec(0, "é".encode()), rec(1, b"\xff")])
    assert text is not None and text.column("value").to_pylist() == ["é"]
    assert [b.record.offset for b in bad] == [1]


def test_table_topic_config_and_aliases() -> None:
    cfg = TableTopicConfig.of("clicks.v1-x", {"table.topic.enable": "true"})
    assert cfg.enabled and cfg.identifier == ("default", "clicks_v1_x")
    assert cfg.dlq_topic == "clicks.v1-x.dlq" and cfg.commit_interval_s == 5.0
    assert default_table_name("9lives") == "t_9lives"
