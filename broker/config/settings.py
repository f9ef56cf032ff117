"""Broker settings, parsed once into a typed frozen `Settings`.

They come from, highest first: command-line flags, `FLOE_<NAME>` environment variables (NAME
upper-cased, dots and dashes as underscores), a TOML file (`--config`), and the defaults below.
Every value is validated at start-up; a bad one stops the broker with a message naming the key
and where it came from. Code reads attributes (`settings.fetch_max_wait_cap_ms`: the key with
dots as underscores); `values`/`sources` by key serve only describe output (DescribeConfigs,
`floe broker --print-settings`).
"""

from __future__ import annotations

import os
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from broker.config.defs import ConfigDef, ConfigError, nonneg, positive


def check_registry_url(url: str) -> str:
    """`url` without a trailing slash if it is http(s)://HOST:PORT[/path] (the
    `schema.registry.url` setting); ConfigError naming the problem otherwise."""
    want = f"schema.registry.url: expected http(s)://HOST:PORT, got {url!r}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"{want} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(want)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"{want} (no credentials, query or fragment)")
    return url.rstrip("/")

RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


def check_replica_selector(value: str) -> bool:
    """Kafka's rack-aware selector (the only one floe has) or '' (off)."""
    if value not in ("", RACK_AWARE_SELECTOR):
        raise ConfigError(
            f"replica.selector.class: {value!r} is not supported; floe has only"
            f" {RACK_AWARE_SELECTOR} ('' turns replica selection off)"
        )
    return True


def check_inflight_flushes(value: int) -> bool:
    if value < 1:
        raise ConfigError(
            f"wal.max.inflight.flushes: at least 1 (1: one WAL upload at a time), got {value}"
        )
    return True


_DEFS = [
    ConfigDef("listen", "string", "127.0.0.1:9092", "HOST:PORT to listen on (port 0: any)"),
    ConfigDef("advertised", "string", None, "HOST:PORT clients are told (default: listen)"),
    ConfigDef("data.dir", "string", "./floe-data", "local directory (caches, defaults)"),
    ConfigDef("node.id", "int", "0", check=nonneg),
    ConfigDef("broker.rack", "string", None, "rack (zone) of this broker, shown in Metadata"),
    ConfigDef(
        "replica.selector.class",
        "string",
        RACK_AWARE_SELECTOR,
        "KIP-392: a leader sends a consumer whose client.rack names another live broker's"
        " rack to that broker (preferred read replica); '' turns it off",
        check=check_replica_selector,
    ),
    ConfigDef(
        "broker.heartbeat.interval.ms",
        "int",
        "500",
        "how often a broker renews its lease and follows leader changes",
        positive,
    ),
    ConfigDef(
        "broker.session.timeout.ms",
        "int",
        "2000",
        "a broker whose lease was not renewed for this long is dead; its partitions move",
        positive,
    ),
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
    ConfigDef(
        "schema.registry.url",
        "string",
        None,
        "http(s)://HOST:PORT of an external Confluent-compatible Schema Registry that produce "
        "validation and table conversion read instead of the built-in one (which is then not "
        "served unless schema.registry is given explicitly)",
        lambda v: not v or bool(check_registry_url(v)),
    ),
    ConfigDef("log.level", "string", "info", choices=("debug", "info", "warning", "error")),
    ConfigDef("auto.create.topics.enable", "boolean", "true"),
    ConfigDef("num.partitions", "int", "1", check=positive),
    ConfigDef("default.replication.factor", "int", "1", check=positive),
    ConfigDef("socket.request.max.bytes", "int", str(100 * 1024 * 1024), check=positive),
    ConfigDef(
        "message.max.bytes",
        "int",
        "1048588",
        "largest record batch; the default of topics' max.message.bytes",
        nonneg,
    ),
    ConfigDef(
        "compression.type",
        "string",
        "producer",
        "codec of stored batches; the default of topics' compression.type",
        choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
    ),
    ConfigDef("log.cleaner.enable", "boolean", "true", "compact cleanup.policy=compact topics"),
    ConfigDef("log.cleaner.backoff.ms", "int", "15000", "how often the log cleaner runs", positive),
    ConfigDef(
        "log.cleaner.dedupe.buffer.size",
        "long",
        str(128 * 1024 * 1024),
        "memory for the cleaner's key map (about 144 bytes per key)",
        lambda v: v >= 1024,
    ),
    ConfigDef("wal.flush.interval.ms", "double", "5", check=lambda v: v >= 0),
    ConfigDef("wal.flush.max.bytes", "int", str(8 * 1024 * 1024), check=positive),
    ConfigDef(
        "wal.max.inflight.flushes",
        "int",
        None,
        "WAL objects uploaded at once (committed one at a time, in order); at least 1"
        " (default: 1 on a local directory, 2 on S3)",
        check_inflight_flushes,
    ),
    ConfigDef(
        "cache.max.bytes",
        "long",
        str(128 * 1024 * 1024),
        "the chunk cache (recent writes within half of it, reads; read-ahead within a quarter)",
        nonneg,
    ),
    ConfigDef("cache.readahead.bytes", "long", str(4 * 1024 * 1024), check=nonneg),
    ConfigDef(
        "memory.trim.interval.ms",
        "int",
        "5000",
        "how often freed heap memory is given back to the system (glibc malloc_trim); 0: never",
        nonneg,
    ),
    ConfigDef("fetch.max.wait.cap.ms", "int", "30000", check=nonneg),
    ConfigDef("group.initial.rebalance.delay.ms", "int", "300", check=nonneg),
    ConfigDef(
        "compaction.interval.ms",
        "int",
        "30000",
        "how often WAL objects are compacted",
        positive,
    ),
    ConfigDef("compaction.min.age.ms", "int", "10000", "WAL objects younger stay", nonneg),
    ConfigDef(
        "compaction.max.bytes",
        "long",
        str(64 * 1024 * 1024),
        "WAL object bytes one compaction pass reads and holds in memory (a run makes as many"
        " passes as the WAL objects old enough need)",
        positive,
    ),
    ConfigDef("stream.object.max.bytes", "long", str(64 * 1024 * 1024), check=positive),
    ConfigDef("stream.chunk.max.bytes", "long", str(1024 * 1024), check=positive),
    ConfigDef("objects.gc.delay.ms", "int", "30000", "unreferenced objects live this long", nonneg),
    ConfigDef("log.retention.check.interval.ms", "int", "60000", check=positive),
    ConfigDef(
        "table.orphan.min.age.ms",
        "long",
        "259200000",
        "unreferenced table data files older than this are deleted (3 days, Iceberg's "
        "default: longer than any commit, a Spark rewrite included, may take)",
        nonneg,
    ),
    ConfigDef("group.min.session.timeout.ms", "int", "6000", check=positive),
    ConfigDef("group.max.session.timeout.ms", "int", "1800000", check=positive),
]


BROKER_CONFIGS: Mapping[str, ConfigDef] = MappingProxyType({d.name: d for d in _DEFS})
HOSTPORT_KEYS = ("listen", "advertised", "metrics", "schema.registry")

HostPort = tuple[str, int]


def env_name(key: str) -> str:
    return "FLOE_" + key.upper().replace(".", "_").replace("-", "_")


def attribute(key: str) -> str:
    """The `Settings` attribute of a setting: `fetch.max.wait.cap.ms` -> fetch_max_wait_cap_ms."""
    return key.replace(".", "_")


def split_hostport(value: str, what: str) -> HostPort:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class Settings:
    """Every broker setting, typed (one attribute per key of BROKER_CONFIGS). HOST:PORT
    settings are (host, port) tuples, None when off ('' given) or unset."""

    listen: HostPort
    advertised: HostPort | None
    data_dir: Path
    node_id: int
    broker_rack: str | None
    replica_selector_class: str
    broker_heartbeat_interval_ms: int
    broker_session_timeout_ms: int
    object_store: str | None
    metadata: str | None
    catalog: str | None
    warehouse: str | None
    metrics: HostPort | None
    schema_registry: HostPort | None
    schema_registry_url: str | None
    log_level: str
    auto_create_topics_enable: bool
    num_partitions: int
    default_replication_factor: int
    socket_request_max_bytes: int
    message_max_bytes: int
    compression_type: str
    log_cleaner_enable: bool
    log_cleaner_backoff_ms: int
    log_cleaner_dedupe_buffer_size: int
    wal_flush_interval_ms: float
    wal_flush_max_bytes: int
    wal_max_inflight_flushes: int | None  # None: by object store (broker/app.py)
    cache_max_bytes: int
    cache_readahead_bytes: int
    memory_trim_interval_ms: int
    fetch_max_wait_cap_ms: int
    group_initial_rebalance_delay_ms: int
    compaction_interval_ms: int
    compaction_min_age_ms: int
    compaction_max_bytes: int
    stream_object_max_bytes: int
    stream_chunk_max_bytes: int
    objects_gc_delay_ms: int
    log_retention_check_interval_ms: int
    table_orphan_min_age_ms: int
    group_min_session_timeout_ms: int
    group_max_session_timeout_ms: int
    # by key, for describe output only: parsed values as given, and where each came from
    values: Mapping[str, Any]
    sources: Mapping[str, str]

    @classmethod
    def of(cls, values: Mapping[str, Any], sources: Mapping[str, str]) -> Settings:
        """Typed settings from parsed values by key (every key of BROKER_CONFIGS)."""
        typed: dict[str, Any] = {}
        for key, value in values.items():
            if key in HOSTPORT_KEYS:
                # listen is required; the others are off when empty
                value = split_hostport(value, key) if value or key == "listen" else None
            elif key == "data.dir":
                value = Path(value)
            typed[attribute(key)] = value
        typed["schema_registry_url"] = values.get("schema.registry.url") or None  # '' = off
        if typed["schema_registry_url"] and sources.get("schema.registry") == "default":
            typed["schema_registry"] = None  # an external registry: the built-in is not served
        return cls(
            **typed, values=MappingProxyType(dict(values)), sources=MappingProxyType(dict(sources))
        )

    @property
    def object_store_url(self) -> str:
        return self.object_store or (self.data_dir.resolve() / "objects").as_uri()

    @property
    def metadata_url(self) -> str:
        return self.metadata or f"sqlite:///{self.data_dir.resolve() / 'meta.db'}"

    @property
    def catalog_url(self) -> str:
        return self.catalog or f"sqlite:///{self.data_dir.resolve() / 'catalog.db'}"

    @property
    def warehouse_url(self) -> str:
        return self.warehouse or (self.data_dir.resolve() / "warehouse").as_uri()

    def describe(self) -> list[tuple[str, str, str]]:
        """(key, value, source) for every setting."""
        return [(k, str(self.values[k]), self.sources[k]) for k in sorted(self.values)]


def _read_file(config_file: str) -> dict[str, Any]:
    try:
        with open(config_file, "rb") as f:
            file_values = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {config_file}: {e}") from e
    file_values = {k.replace("-", ".").replace("_", "."): v for k, v in file_values.items()}
    unknown = sorted(set(file_values) - set(BROKER_CONFIGS))
    if unknown:
        raise ConfigError(f"unknown setting(s) in {config_file}: {', '.join(unknown)}")
    return file_values


def load_settings(
    flags: Mapping[str, str | None],
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve every broker setting: flags > FLOE_* env > TOML file > defaults."""
    environ = os.environ if environ is None else environ
    file_values = _read_file(config_file) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
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
            values[key] = None if raw is None else d.parse(str(raw))
        except ConfigError as e:
            raise ConfigError(f"{e} (from {src})") from None
        sources[key] = src
    return Settings.of(values, sources)
