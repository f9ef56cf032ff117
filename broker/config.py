"""Broker settings and Kafka topic configs.

Broker settings come from, highest first: command-line flags, `FLOE_<NAME>` environment
variables (NAME upper-cased, dots and dashes as underscores), a TOML file (`--config`), and the
defaults below. Every value is validated at start-up; a bad one stops the broker with a message
naming the key and where it came from.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    pass


# --------------------------------------------------------------------------------------------
# Typed config definitions (shared by broker settings and topic configs)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigDef:
    name: str
    type: str  # boolean | int | long | double | string | list | password
    default: str | None
    doc: str = ""
    check: Callable[[Any], bool] | None = None
    choices: tuple[str, ...] = ()

    def parse(self, raw: str) -> Any:
        try:
            value: Any
            if self.type == "boolean":
                low = raw.strip().lower()
                if low not in ("true", "false"):
                    raise ValueError(raw)
                value = low == "true"
            elif self.type in ("int", "long"):
                value = int(raw.strip())
                if self.type == "int" and not -(2**31) <= value < 2**31:
                    raise ValueError(raw)
                if not -(2**63) <= value < 2**63:
                    raise ValueError(raw)
            elif self.type == "double":
                value = float(raw)
            elif self.type == "list":
                value = [v.strip() for v in raw.split(",") if v.strip()]
            else:
                value = raw
        except ValueError:
            raise ConfigError(f"invalid value {raw!r} for {self.name} (a {self.type})") from None
        if self.choices:
            values = value if isinstance(value, list) else [value]
            for v in values:
                if str(v).lower() not in self.choices:
                    raise ConfigError(
                        f"invalid value {raw!r} for {self.name}: one of {', '.join(self.choices)}"
                    )
        if self.check is not None and not self.check(value):
            raise ConfigError(f"invalid value {raw!r} for {self.name}")
        return value


def _nonneg(v: int) -> bool:
    return v >= 0


def _min_minus1(v: int) -> bool:
    return v >= -1


def _positive(v: int) -> bool:
    return v > 0


LONG_MAX = str(2**63 - 1)

TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef(
            "cleanup.policy",
            "list",
            "delete",
            "delete (retention), compact (log cleaner, keyed records only) or both",
            choices=("delete", "compact"),
        ),
        ConfigDef(
            "compression.type",
            "string",
            "producer",
            "codec of stored batches; producer keeps the one sent",
            choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
        ),
        ConfigDef(
            "delete.retention.ms",
            "long",
            "86400000",
            "how long the cleaner keeps a tombstone after the cleaning that kept it",
            _nonneg,
        ),
        ConfigDef("file.delete.delay.ms", "long", "60000", check=_nonneg),
        ConfigDef("flush.messages", "long", LONG_MAX, check=_positive),
        ConfigDef("flush.ms", "long", LONG_MAX, check=_nonneg),
        ConfigDef("index.interval.bytes", "int", "4096", check=_nonneg),
        ConfigDef(
            "max.compaction.lag.ms",
            "long",
            LONG_MAX,
            "clean a partition once its oldest uncleaned chunk is this old",
            _positive,
        ),
        ConfigDef(
            "max.message.bytes",
            "int",
            "1048588",
            "largest record batch (default: the broker's message.max.bytes)",
            _nonneg,
        ),
        ConfigDef("message.downconversion.enable", "boolean", "true"),
        ConfigDef(
            "message.timestamp.type",
            "string",
            "CreateTime",
            choices=("createtime", "logappendtime"),
        ),
        ConfigDef(
            "message.timestamp.difference.max.ms",
            "long",
            LONG_MAX,
            "CreateTime records further than this from now: INVALID_TIMESTAMP (deprecated)",
            _nonneg,
        ),
        ConfigDef(
            "message.timestamp.before.max.ms",
            "long",
            LONG_MAX,
            "CreateTime records older than this: INVALID_TIMESTAMP",
            _nonneg,
        ),
        ConfigDef(
            "message.timestamp.after.max.ms",
            "long",
            LONG_MAX,
            "CreateTime records further ahead than this: INVALID_TIMESTAMP",
            _nonneg,
        ),
        ConfigDef(
            "min.cleanable.dirty.ratio",
            "double",
            "0.5",
            "clean once uncleaned bytes are this share of the cleanable log",
            lambda v: 0 <= v <= 1,
        ),
        ConfigDef(
            "min.compaction.lag.ms",
            "long",
            "0",
            "records younger than this are never cleaned",
            _nonneg,
        ),
        ConfigDef("min.insync.replicas", "int", "1", check=_positive),
        ConfigDef("preallocate", "boolean", "false"),
        ConfigDef("retention.bytes", "long", "-1", check=_min_minus1),
        ConfigDef("retention.ms", "long", "604800000", check=_min_minus1),
        ConfigDef("segment.bytes", "int", "1073741824", check=lambda v: v >= 14),
        ConfigDef("segment.index.bytes", "int", "10485760", check=_nonneg),
        ConfigDef("segment.jitter.ms", "long", "0", check=_nonneg),
        ConfigDef("segment.ms", "long", "604800000", check=_positive),
        ConfigDef("unclean.leader.election.enable", "boolean", "false"),
        ConfigDef("local.retention.ms", "long", "-2", check=lambda v: v >= -2),
        ConfigDef("local.retention.bytes", "long", "-2", check=lambda v: v >= -2),
        ConfigDef("remote.storage.enable", "boolean", "false"),
        # table topics (also accepted with AutoMQ's prefix, automq.table.topic.*)
        ConfigDef(
            "table.topic.enable", "boolean", "false", "write the topic into an Iceberg table"
        ),
        ConfigDef("table.topic.namespace", "string", "default", "Iceberg namespace"),
        ConfigDef("table.topic.name", "string", "", "table name (default: from the topic name)"),
        ConfigDef(
            "table.topic.commit.interval.ms",
            "long",
            "5000",
            "longest time between commits",
            lambda v: 1 <= v <= 900_000,
        ),
        ConfigDef(
            "table.topic.commit.max.records",
            "long",
            "1000000",
            "commit earlier once this many records are pending",
            _positive,
        ),
        ConfigDef(
            "table.topic.commit.max.bytes",
            "long",
            str(128 * 1024 * 1024),
            "commit earlier once this many bytes are pending",
            _positive,
        ),
        ConfigDef(
            "table.topic.convert.value.type",
            "string",
            "raw",
            "how values become columns",
            choices=("raw", "string", "json", "by_schema_id", "by_latest_schema"),
        ),
        ConfigDef(
            "table.topic.convert.value.subject",
            "string",
            "",
            "by_latest_schema: the Schema Registry subject (default <topic>-value)",
        ),
        ConfigDef(
            "table.topic.errors.tolerance",
            "string",
            "invalid_data",
            "none: stop the partition; invalid_data/all: bad records go to the DLQ",
            choices=("none", "invalid_data", "all"),
        ),
        ConfigDef("table.topic.dlq.topic", "string", "", "dead-letter topic (default <topic>.dlq)"),
        # schema validation at produce (broker/schemavalidation.py), Confluent's keys
        ConfigDef(
            "confluent.value.schema.validation",
            "boolean",
            "false",
            "values must carry a schema id of subject <topic>-value: INVALID_RECORD otherwise",
        ),
        ConfigDef(
            "confluent.key.schema.validation",
            "boolean",
            "false",
            "keys must carry a schema id of subject <topic>-key: INVALID_RECORD otherwise",
        ),
        *(
            ConfigDef(
                f"confluent.{part}.subject.name.strategy",
                "string",
                "io.confluent.kafka.serializers.subject.TopicNameStrategy",
                "only TopicNameStrategy (<topic>-key, <topic>-value)",
                choices=(
                    "io.confluent.kafka.serializers.subject.topicnamestrategy",
                    "topicnamestrategy",
                ),
            )
            for part in ("key", "value")
        ),
    ]
}
# Accepted and validated, but with nothing to act on in floe, on purpose; each reason makes floe
# at least as strict as Kafka. Kafka Streams and Connect set several of these on their internal
# topics, so refusing them would break those users. README.md ("Topic configs") lists them.
INERT_TOPIC_CONFIGS: dict[str, str] = {
    "file.delete.delay.ms": "unreferenced objects are deleted after the broker-wide"
    " objects.gc.delay.ms",
    "flush.messages": "every acknowledged record is already durable in object storage",
    "flush.ms": "every acknowledged record is already durable in object storage",
    "index.interval.bytes": "no index files: the chunk index lives in the metadata store",
    "message.downconversion.enable": "floe serves record batch v2 only (Fetch v4+), so it never"
    " down-converts",
    "min.insync.replicas": "an acknowledged record is in object storage (replicated by the store)"
    " and committed in the metadata store, whatever the value",
    "preallocate": "no segment files",
    "segment.bytes": "no segments: retention and cleaning work on chunks (one WAL flush, or up"
    " to stream.chunk.max.bytes), which is finer-grained",
    "segment.index.bytes": "no segment index files",
    "segment.jitter.ms": "no segments to roll",
    "segment.ms": "no segments to roll: retention and cleaning work on chunks",
    "unclean.leader.election.enable": "there is one log in object storage and no out-of-sync"
    " replica that could lose acknowledged records",
    "local.retention.ms": "nothing is retained locally except a bounded read cache"
    " (cache.max.bytes)",
    "local.retention.bytes": "nothing is retained locally except a bounded read cache"
    " (cache.max.bytes)",
    "remote.storage.enable": "the whole log always lives in object storage",
}
TOPIC_CONFIGS.update(
    {k: replace(TOPIC_CONFIGS[k], doc=f"accepted, no effect: {why}")
     for k, why in INERT_TOPIC_CONFIGS.items()}
)
TOPIC_CONFIG_ALIASES = {"automq.table.topic.": "table.topic."}


def canonical_topic_config(key: str) -> str:
    for alias, prefix in TOPIC_CONFIG_ALIASES.items():
        if key.startswith(alias):
            return prefix + key[len(alias) :]
    return key


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Check keys and values like Kafka does; returns the non-null ones. Raises ConfigError."""
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


# topic configs whose default is a broker setting (Kafka's synonyms), topic key -> broker key
TOPIC_BROKER_DEFAULTS = {
    "max.message.bytes": "message.max.bytes",
    "compression.type": "compression.type",
}


def topic_defaults(settings: Settings) -> dict[str, str]:
    """The broker settings that serve as topic config defaults, as topic config strings."""
    out = {}
    for topic_key, broker_key in TOPIC_BROKER_DEFAULTS.items():
        value = settings.values.get(broker_key)
        if value is not None:
            out[topic_key] = str(value)
    return out


def topic_config_value(
    configs: Mapping[str, str], key: str, defaults: Mapping[str, str] | None = None
) -> Any:
    """A topic config's parsed value: set on the topic, else the broker default (`defaults`,
    see topic_defaults), else Kafka's default."""
    d = TOPIC_CONFIGS[key]
    raw = configs.get(key)
    if raw is None:
        raw = (defaults or {}).get(key, d.default)
    assert raw is not None
    return d.parse(raw)


# --------------------------------------------------------------------------------------------
# Broker settings
# --------------------------------------------------------------------------------------------
BROKER_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef("listen", "string", "127.0.0.1:9092", "HOST:PORT to listen on (port 0: any)"),
        ConfigDef("advertised", "string", None, "HOST:PORT clients are told (default: listen)"),
        ConfigDef("data.dir", "string", "./floe-data", "local directory (caches, defaults)"),
        ConfigDef("node.id", "int", "0", check=_nonneg),
        ConfigDef("object.store", "string", None, "URL; default file://<data-dir>/objects"),
        ConfigDef("metadata", "string", None, "URL; default sqlite:///<data-dir>/meta.db"),
        ConfigDef(
            "catalog",
            "string",
            None,
            "Iceberg catalog URL; default sqlite:///<data-dir>/catalog.db",
        ),
        ConfigDef(
            "warehouse",
            "string",
            None,
            "Iceberg warehouse URL; default file://<data-dir>/warehouse",
        ),
        ConfigDef(
            "metrics",
            "string",
            "127.0.0.1:9644",
            "admin HOST:PORT serving /metrics and /status (off if empty)",
        ),
        ConfigDef(
            "schema.registry",
            "string",
            "127.0.0.1:8081",
            "HOST:PORT serving the Confluent-compatible Schema Registry (off if empty)",
        ),
        ConfigDef("log.level", "string", "info", choices=("debug", "info", "warning", "error")),
        ConfigDef("auto.create.topics.enable", "boolean", "true"),
        ConfigDef("num.partitions", "int", "1", check=_positive),
        ConfigDef("default.replication.factor", "int", "1", check=_positive),
        ConfigDef("socket.request.max.bytes", "int", str(100 * 1024 * 1024), check=_positive),
        ConfigDef(
            "message.max.bytes",
            "int",
            "1048588",
            "largest record batch; the default of topics' max.message.bytes",
            _nonneg,
        ),
        ConfigDef(
            "compression.type",
            "string",
            "producer",
            "codec of stored batches; the default of topics' compression.type",
            choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
        ),
        ConfigDef("log.cleaner.enable", "boolean", "true", "compact cleanup.policy=compact topics"),
        ConfigDef(
            "log.cleaner.backoff.ms", "int", "15000", "how often the log cleaner runs", _positive
        ),
        ConfigDef(
            "log.cleaner.dedupe.buffer.size",
            "long",
            str(128 * 1024 * 1024),
            "memory for the cleaner's key map (about 144 bytes per key)",
            lambda v: v >= 1024,
        ),
        ConfigDef("wal.flush.interval.ms", "double", "5", check=lambda v: v >= 0),
        ConfigDef("wal.flush.max.bytes", "int", str(8 * 1024 * 1024), check=_positive),
        ConfigDef("cache.max.bytes", "long", str(256 * 1024 * 1024), check=_nonneg),
        ConfigDef("cache.readahead.bytes", "long", str(4 * 1024 * 1024), check=_nonneg),
        ConfigDef("fetch.max.wait.cap.ms", "int", "30000", check=_nonneg),
        ConfigDef("group.initial.rebalance.delay.ms", "int", "300", check=_nonneg),
        ConfigDef(
            "compaction.interval.ms",
            "int",
            "30000",
            "how often WAL objects are compacted",
            _positive,
        ),
        ConfigDef("compaction.min.age.ms", "int", "10000", "WAL objects younger stay", _nonneg),
        ConfigDef("compaction.max.bytes", "long", str(256 * 1024 * 1024), check=_positive),
        ConfigDef("stream.object.max.bytes", "long", str(64 * 1024 * 1024), check=_positive),
        ConfigDef("stream.chunk.max.bytes", "long", str(1024 * 1024), check=_positive),
        ConfigDef(
            "objects.gc.delay.ms", "int", "30000", "unreferenced objects live this long", _nonneg
        ),
        ConfigDef("log.retention.check.interval.ms", "int", "60000", check=_positive),
        ConfigDef(
            "table.orphan.min.age.ms",
            "long",
            "259200000",
            "unreferenced table data files older than this are deleted (3 days, Iceberg's "
            "default: longer than any commit, a Spark rewrite included, may take)",
            _nonneg,
        ),
        ConfigDef("group.min.session.timeout.ms", "int", "6000", check=_positive),
        ConfigDef("group.max.session.timeout.ms", "int", "1800000", check=_positive),
    ]
}


def env_name(key: str) -> str:
    return "FLOE_" + key.upper().replace(".", "_").replace("-", "_")


@dataclass
class Settings:
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def data_dir(self) -> Path:
        return Path(self.values["data.dir"])

    @property
    def listen(self) -> tuple[str, int]:
        return split_hostport(self.values["listen"], "listen")

    @property
    def object_store_url(self) -> str:
        url = self.values["object.store"]
        return url or (self.data_dir.resolve() / "objects").as_uri()

    @property
    def metadata_url(self) -> str:
        url = self.values["metadata"]
        return url or f"sqlite:///{self.data_dir.resolve() / 'meta.db'}"

    @property
    def catalog_url(self) -> str:
        url = self.values["catalog"]
        return url or f"sqlite:///{self.data_dir.resolve() / 'catalog.db'}"

    @property
    def warehouse_url(self) -> str:
        url = self.values["warehouse"]
        return url or (self.data_dir.resolve() / "warehouse").as_uri()

    def describe(self) -> list[tuple[str, str, str]]:
        """(key, value, source) for every setting."""
        return [(k, str(self.values[k]), self.sources[k]) for k in sorted(self.values)]


def split_hostport(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def load_settings(
    flags: Mapping[str, str | None],
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve every broker setting: flags > FLOE_* env > TOML file > defaults."""
    environ = os.environ if environ is None else environ
    file_values: dict[str, Any] = {}
    if config_file:
        try:
            with open(config_file, "rb") as f:
                file_values = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config file {config_file}: {e}") from e
        file_values = {k.replace("-", ".").replace("_", "."): v for k, v in file_values.items()}
        unknown = sorted(set(file_values) - set(BROKER_CONFIGS))
        if unknown:
            raise ConfigError(f"unknown setting(s) in {config_file}: {', '.join(unknown)}")
    s = Settings()
    for key, d in BROKER_CONFIGS.items():
        raw: Any = None
        if flags.get(key) is not None:
            raw, src = flags[key], "flag"
        elif env_name(key) in environ:
            raw, src = environ[env_name(key)], f"env {env_name(key)}"
        elif key in file_values:
            raw, src = file_values[key], f"file {config_file}"
            if isinstance(raw, bool):
                raw = str(raw).lower()
            raw = str(raw)
        else:
            raw, src = d.default, "default"
        try:
            s.values[key] = None if raw is None else d.parse(str(raw))
        except ConfigError as e:
            raise ConfigError(f"{e} (from {src})") from None
        s.sources[key] = src
    split_hostport(s.values["listen"], "listen")
    for key in ("advertised", "metrics", "schema.registry"):
        if s.values[key]:
            split_hostport(s.values[key], key)
    return s
