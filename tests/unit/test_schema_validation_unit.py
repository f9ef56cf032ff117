"""Schema validation's wire-format parsing and its per-subject id cache
(broker/schemavalidation.py)."""

from __future__ import annotations

import struct

import pytest

from broker.config import ConfigError, validate_topic_configs
from broker.schemavalidation import (
    SubjectIdCache,
    WireFormatError,
    schema_id,
    subject_for,
)


def test_schema_id_reads_magic_and_big_endian_id() -> None:
    assert schema_id(b"\x00" + struct.pack(">i", 1) + b"payload") == 1
    assert schema_id(b"\x00\x01\x02\x03\x04") == 0x01020304  # no payload: still an id
    assert schema_id(memoryview(b"\x00\x00\x00\x01\x00\x08\x00")) == 256  # protobuf indexes


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00\x01", b"\x01\x00\x00\x00\x01",
                                  b"{\"json\": 1}"])
def test_schema_id_refuses_other_bytes(data: bytes) -> None:
    with pytest.raises(WireFormatError):
        schema_id(data)


def test_subject_names_follow_topic_name_strategy() -> None:
    assert subject_for("orders", is_key=False) == "orders-value"
    assert subject_for("orders", is_key=True) == "orders-key"


def test_only_topic_name_strategy_is_accepted() -> None:
    for key in ("confluent.value.subject.name.strategy", "confluent.key.subject.name.strategy"):
        validate_topic_configs({key: "io.confluent.kafka.serializers.subject.TopicNameStrategy"})
        for other in ("io.confluent.kafka.serializers.subject.RecordNameStrategy",
                      "TopicRecordNameStrategy"):
            with pytest.raises(ConfigError):
                validate_topic_configs({key: other})
    with pytest.raises(ConfigError):
        validate_topic_configs({"confluent.value.schema.validation": "yes"})


class Registry:
    """Subjects' live ids, as the registry would answer them; counts the questions."""

    def __init__(self) -> None:
        self.ids: dict[str, set[int]] = {}
        self.asked = 0

    async def load(self, subject: str) -> frozenset[int]:
        self.asked += 1
        return frozenset(self.ids.get(subject, ()))


async def test_cache_hits_need_no_io_within_the_ttl_and_misses_reload() -> None:
    reg, now = Registry(), [0.0]
    cache = SubjectIdCache(reg.load, ttl_s=5.0, clock=lambda: now[0])
    reg.ids["t-value"] = {1}
    assert await cache.contains("t-value", 1) and reg.asked == 1
    assert await cache.contains("t-value", 1) and reg.asked == 1  # hit: no load
    reg.ids["t-value"].add(2)  # newly registered: a miss reloads at once
    assert await cache.contains("t-value", 2) and reg.asked == 2
    assert not await cache.contains("t-value", 3) and reg.asked == 3  # negatives are fresh
    reg.ids["t-value"] = set()  # deleted: still a hit inside the window...
    now[0] = 4.9
    assert await cache.contains("t-value", 1) and reg.asked == 3
    now[0] = 5.1  # ...and refused once it has passed
    assert not await cache.contains("t-value", 1) and reg.asked == 4
    reg.ids["t-value"] = {1}
    assert await cache.contains("t-value", 1)
    cache.invalidate("t-value")
    reg.ids["t-value"] = set()
    assert not await cache.contains("t-value", 1)  # invalidated: reloaded
    assert not await cache.contains("u-value", 1)  # unknown subject: no ids
