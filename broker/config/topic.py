"""Topic configs: the registry of known keys, Kafka-like validation, and `TopicConfig`, a
topic's configs parsed once (when the topic is created, altered or loaded) into typed values
that produce, fetch, retention and the log cleaner read as attributes.

Keys are registered by the package acting on them: the broker's own (`topic_defs`) here,
`table.topic.*` by tabletopic (`tabletopic/config.py`, imported by the composition root). A
key nobody registered is refused with INVALID_CONFIG naming it, exactly like an unknown one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from broker.config.defs import ConfigError, ConfigRegistry
from broker.config.topic_defs import broker_topic_configs

if TYPE_CHECKING:
    from broker.config.settings import Settings

TOPIC_CONFIGS = ConfigRegistry("topic config")
TOPIC_CONFIGS.register("broker", broker_topic_configs())

# topic configs whose default is a broker setting (Kafka's synonyms), topic key -> broker key
TOPIC_BROKER_DEFAULTS = {
    "max.message.bytes": "message.max.bytes",
    "compression.type": "compression.type",
}


def canonical_topic_config(key: str) -> str:
    return TOPIC_CONFIGS.canonical(key)


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check keys and values like Kafka does; returns the non-null ones (by canonical key).
    Raises ConfigError naming the key."""
    out = {}
    for given, raw in configs.items():
        key = canonical_topic_config(given)
        d = TOPIC_CONFIGS.get(key)
        if d is None:
            raise ConfigError(f"Unknown topic config name: {given}")
        if raw is None:
            raise ConfigError(f"Null value not supported for topic config {key}")
        d.parse(raw)
        out[key] = raw
    return out


def topic_defaults(settings: Settings) -> dict[str, str]:
    """The broker settings that serve as topic config defaults, as topic config strings."""
    out = {}
    for topic_key, broker_key in TOPIC_BROKER_DEFAULTS.items():
        value = settings.values.get(broker_key)
        if value is not None:
            out[topic_key] = str(value)
    return out


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's configs, parsed once. `raw` is what was set on the topic (DescribeConfigs,
    the metadata store); `values` holds every registered key's effective value (set on the
    topic, else the broker default, else Kafka's), for packages with their own keys (`get`)."""

    raw: Mapping[str, str]
    values: Mapping[str, object]
    cleanup_policy: tuple[str, ...]
    compression_type: str  # lower case; "producer" keeps each batch's codec
    max_message_bytes: int
    log_append_time: bool  # message.timestamp.type=LogAppendTime
    message_timestamp_before_max_ms: int
    message_timestamp_after_max_ms: int
    message_timestamp_difference_max_ms: int
    retention_ms: int
    retention_bytes: int
    delete_retention_ms: int
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    min_cleanable_dirty_ratio: float
    value_schema_validation: bool
    key_schema_validation: bool

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    def get(self, key: str) -> object:
        """A registered key's parsed value (for keys of other packages, e.g. table.topic.*)."""
        try:
            return self.values[key]
        except KeyError:
            raise ConfigError(f"topic config {key} is not registered") from None

    @classmethod
    def parse(
        cls, configs: Mapping[str, str], defaults: Mapping[str, str] | None = None
    ) -> TopicConfig:
        """Parse `configs` (keys checked like `validate_topic_configs`: an unregistered one is
        a ConfigError naming it); `defaults` are the broker's (see `topic_defaults`)."""
        raw = validate_topic_configs(configs)
        values: dict[str, object] = {}
        for key, d in TOPIC_CONFIGS.items():
            given = raw.get(key)
            if given is None:
                given = (defaults or {}).get(key, d.default)
            values[key] = None if given is None else d.parse(given)

        def num(key: str) -> int:
            v = values[key]
            assert isinstance(v, int) and not isinstance(v, bool), key
            return v

        def flag(key: str) -> bool:
            v = values[key]
            assert isinstance(v, bool), key
            return v

        policy = values["cleanup.policy"]
        ratio = values["min.cleanable.dirty.ratio"]
        assert isinstance(policy, list) and isinstance(ratio, float)
        return cls(
            raw=MappingProxyType(raw),
            values=MappingProxyType(values),
            cleanup_policy=tuple(p.lower() for p in policy),
            compression_type=str(values["compression.type"]).lower(),
            max_message_bytes=num("max.message.bytes"),
            log_append_time=str(values["message.timestamp.type"]).lower() == "logappendtime",
            message_timestamp_before_max_ms=num("message.timestamp.before.max.ms"),
            message_timestamp_after_max_ms=num("message.timestamp.after.max.ms"),
            message_timestamp_difference_max_ms=num("message.timestamp.difference.max.ms"),
            retention_ms=num("retention.ms"),
            retention_bytes=num("retention.bytes"),
            delete_retention_ms=num("delete.retention.ms"),
            min_compaction_lag_ms=num("min.compaction.lag.ms"),
            max_compaction_lag_ms=num("max.compaction.lag.ms"),
            min_cleanable_dirty_ratio=ratio,
            value_schema_validation=flag("confluent.value.schema.validation"),
            key_schema_validation=flag("confluent.key.schema.validation"),
        )
