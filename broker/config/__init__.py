"""Broker settings and Kafka topic configs (see the modules: `defs` the definitions and the
registry, `settings` the typed broker settings, `topic` and `topic_defs` the topic configs)."""

from broker.config.defs import (
    LONG_MAX,
    ConfigDef,
    ConfigError,
    ConfigRegistry,
    RegistrationError,
    min_minus1,
    nonneg,
    positive,
)
from broker.config.settings import (
    BROKER_CONFIGS,
    HostPort,
    Settings,
    env_name,
    load_settings,
    split_hostport,
)
from broker.config.topic import (
    TOPIC_BROKER_DEFAULTS,
    TOPIC_CONFIGS,
    TopicConfig,
    canonical_topic_config,
    topic_defaults,
    validate_topic_configs,
)
from broker.config.topic_defs import INERT_TOPIC_CONFIGS

__all__ = [
    "BROKER_CONFIGS",
    "INERT_TOPIC_CONFIGS",
    "LONG_MAX",
    "TOPIC_BROKER_DEFAULTS",
    "TOPIC_CONFIGS",
    "ConfigDef",
    "ConfigError",
    "ConfigRegistry",
    "HostPort",
    "RegistrationError",
    "Settings",
    "TopicConfig",
    "canonical_topic_config",
    "env_name",
    "load_settings",
    "min_minus1",
    "nonneg",
    "positive",
    "split_hostport",
    "topic_defaults",
    "validate_topic_configs",
]
