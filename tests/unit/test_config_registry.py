"""The config registry (each package registers its own topic config keys), typed frozen broker
settings and topic configs parsed once (broker/config/, tabletopic/config.py)."""

from __future__ import annotations

import dataclasses
import time
import types
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

import tabletopic.config as table_config
from broker import recordpolicy
from broker.config import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    ConfigDef,
    ConfigError,
    ConfigRegistry,
    RegistrationError,
    Settings,
    TopicConfig,
    load_settings,
    topic_defaults,
    validate_topic_configs,
)
from broker.engine import Topic
from broker.errors import KafkaError
from tabletopic.config import TableTopicConfig


@pytest.fixture
def without_tabletopic() -> Iterator[None]:
    TOPIC_CONFIGS.unregister(table_config.OWNER)
    try:
        yield
    finally:
        table_config.register()


def test_a_key_or_an_owner_registered_twice_fails() -> None:
    """Must survive: a package registering a key another owns (or registering twice) is an
    error that changes nothing, not a silent override of the other's definition."""
    reg = ConfigRegistry("topic config")
    reg.register("a", [ConfigDef("x.y", "int", "1")])
    with pytest.raises(RegistrationError, match=r"x\.y"):
        reg.register("b", [ConfigDef("z", "int", "1"), ConfigDef("x.y", "long", "2")])
    assert "z" not in reg and reg["x.y"].type == "int" and reg.owner("x.y") == "a"
    with pytest.raises(RegistrationError, match="already registered"):
        reg.register("a", [ConfigDef("w", "int", "1")])
    with pytest.raises(RegistrationError, match="twice"):
        reg.register("c", [ConfigDef("v", "int", "1"), ConfigDef("v", "int", "1")])
    with pytest.raises(RegistrationError):
        table_config.register()  # already registered at import
    with pytest.raises(RegistrationError, match=r"retention\.ms"):
        TOPIC_CONFIGS.register("other", [ConfigDef("retention.ms", "long", "1")])


def test_table_topic_keys_belong_to_tabletopic(without_tabletopic: None) -> None:
    """Must survive: table.topic.* exist only while tabletopic registered them; without, the
    key is refused naming it (INVALID_CONFIG upstream) and a stored topic carrying one fails
    to load, loudly, instead of its configs being silently dropped."""
    assert not any(k.startswith("table.topic.") for k in TOPIC_CONFIGS)
    for key in ("table.topic.enable", "automq.table.topic.enable"):
        with pytest.raises(ConfigError, match=key):
            validate_topic_configs({key: "true"})
    with pytest.raises(ConfigError, match=r"table\.topic\.enable"):
        Topic("t", uuid.uuid4(), {"table.topic.enable": "true"})
    plain = TopicConfig.parse({})
    with pytest.raises(ConfigError, match="not registered"):
        plain.get("table.topic.enable")
    table_config.register()
    try:
        assert TOPIC_CONFIGS.owner("table.topic.enable") == "tabletopic"
        assert validate_topic_configs({"automq.table.topic.enable": "true"}) == {
            "table.topic.enable": "true"
        }
    finally:
        TOPIC_CONFIGS.unregister(table_config.OWNER)


def test_table_topic_config_is_a_typed_view() -> None:
    t = Topic(
        "clicks.v1",
        uuid.uuid4(),
        {"automq.table.topic.enable": "true", "table.topic.commit.interval.ms": "250"},
    )
    cfg = TableTopicConfig.of(t.name, t.config)
    assert cfg.enabled and cfg.commit_interval_s == 0.25 and cfg.table == "clicks_v1"
    assert cfg.dlq_topic == "clicks.v1.dlq" and cfg.commit_max_records == 1_000_000
    assert TableTopicConfig.of("x", {}).enabled is False


def test_settings_are_typed_and_frozen(tmp_path: Path) -> None:
    """Must survive: every broker setting is an attribute of the declared type, and nothing can
    change a Settings object once parsed."""
    s = load_settings(
        {"advertised": "h.example:19092", "metrics": "", "data.dir": str(tmp_path)},
        environ={"FLOE_WAL_FLUSH_INTERVAL_MS": "2.5", "FLOE_LOG_CLEANER_ENABLE": "false"},
    )
    hints = typing.get_type_hints(Settings)
    names = {f.name for f in dataclasses.fields(Settings)} - {"values", "sources"}
    assert names == {k.replace(".", "_") for k in BROKER_CONFIGS}
    assert s.listen == ("127.0.0.1", 9092) and s.advertised == ("h.example", 19092)
    assert s.metrics is None and s.schema_registry == ("127.0.0.1", 8081)
    assert s.data_dir == tmp_path and s.wal_flush_interval_ms == 2.5
    assert s.log_cleaner_enable is False and s.fetch_max_wait_cap_ms == 30000
    for name in names:
        value = getattr(s, name)
        hint = hints[name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        allowed = typing.get_args(hint) if union else (hint,)
        origins = tuple(typing.get_origin(a) or a for a in allowed)
        assert isinstance(value, origins), (name, value, hint)
        assert isinstance(value, bool) == (bool in origins), (name, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_partitions = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.values["num.partitions"] = 3  # type: ignore[index]
    assert ("wal.flush.interval.ms", "2.5", "env FLOE_WAL_FLUSH_INTERVAL_MS") in s.describe()


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"advertised": "nohost"}, "advertised: expected HOST:PORT"),
        ({"metrics": "h:99999"}, "metrics: expected HOST:PORT"),
        ({"wal.flush.interval.ms": "soon"}, r"wal.flush.interval.ms \(a double\) \(from flag"),
        ({"log.cleaner.enable": "yes"}, "log.cleaner.enable"),
        ({"cache.max.bytes": "-1"}, "cache.max.bytes"),
    ],
)
def test_bad_settings_name_the_key(flags: dict[str, str | None], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(flags, environ={})


def test_topic_config_parsed_once_with_broker_defaults() -> None:
    """Must survive: a topic's configs are parsed when set, typed, with the broker's defaults;
    producing reads the typed values and parses nothing."""
    settings = load_settings({"message.max.bytes": "5000"}, environ={})
    defaults = topic_defaults(settings)
    t = Topic(
        "t",
        uuid.uuid4(),
        {
            "cleanup.policy": "Compact,delete",
            "compression.type": "GZIP",
            "message.timestamp.type": "LogAppendTime",
        },
        defaults=defaults,
    )
    c = t.config
    assert c.cleanup_policy == ("compact", "delete") and c.compact and c.delete
    assert c.compression_type == "gzip" and c.log_append_time
    assert c.max_message_bytes == 5000 and c.retention_ms == 604800000
    assert c.min_cleanable_dirty_ratio == 0.5 and c.value_schema_validation is False
    assert t.configs == {
        "cleanup.policy": "Compact,delete",
        "compression.type": "GZIP",
        "message.timestamp.type": "LogAppendTime",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.retention_ms = 1  # type: ignore[misc]
    t.configs = {"retention.ms": "1000", "max.message.bytes": "64"}  # altered: parsed again
    assert t.config.retention_ms == 1000 and t.config.max_message_bytes == 64
    assert not t.config.compact and t.config.compression_type == "producer"
    with pytest.raises(ConfigError, match="Unknown topic config name: nope"):
        t.configs = {"nope": "1"}


def test_produce_path_parses_no_config_string(monkeypatch: pytest.MonkeyPatch) -> None:
    """Must survive: every produce-side check (size, keys, timestamps, codec) reads the typed
    config; none parses a config string (ConfigDef.parse made to fail after creation)."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    b.append(0, int(time.time() * 1000), b"k", b"v" * 100, [])
    sent = bytes(b.build())
    ok = Topic(
        "t",
        uuid.uuid4(),
        {
            "cleanup.policy": "compact",
            "compression.type": "GZIP",
            "message.timestamp.before.max.ms": "60000",
        },
    )
    small = Topic("s", uuid.uuid4(), {"max.message.bytes": "10"})

    def no_parse(self: ConfigDef, raw: str) -> object:
        raise AssertionError(f"{self.name} parsed on the produce path")

    monkeypatch.setattr(ConfigDef, "parse", no_parse)
    stored, headers = recordpolicy.apply(sent, ok.config)
    assert headers[0].compression == 1 and stored != sent  # re-encoded with gzip
    with pytest.raises(KafkaError, match=r"max\.message\.bytes 10"):
        recordpolicy.apply(sent, small.config)
