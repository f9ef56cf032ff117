"""Table-topic settings: tabletopic's topic config keys (`table.topic.*`, AutoMQ's
`automq.table.topic.*` too), registered with the broker's topic config registry when this
module is imported (broker.app, the composition root, imports it: before any topic is parsed),
and `TableTopicConfig`, their typed view of a topic's parsed configs."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from broker.config import TOPIC_CONFIGS, ConfigDef, ConfigError, TopicConfig, positive
from tabletopic.partitioning import (
    Layout,
    LayoutError,
    parse_id_columns,
    parse_partition_by,
    parse_sort_by,
)

OWNER = "tabletopic"
# how old an unreferenced table file must be before the sweep deletes it: Iceberg's default;
# the broker setting table.orphan.min.age.ms (tabletopic.orphans)
ORPHAN_MIN_AGE_S = 3 * 24 * 3600.0
PREFIX = "table.topic."
ALIASES = {"automq.table.topic.": PREFIX}

TABLE_TOPIC_CONFIGS = (
    ConfigDef(PREFIX + "enable", "boolean", "false", "write the topic into an Iceberg table"),
    ConfigDef(PREFIX + "namespace", "string", "default", "Iceberg namespace"),
    ConfigDef(PREFIX + "name", "string", "", "table name (default: from the topic name)"),
    ConfigDef(
        PREFIX + "commit.interval.ms",
        "long",
        "5000",
        "longest time between commits",
        lambda v: 1 <= v <= 900_000,
    ),
    ConfigDef(
        PREFIX + "commit.max.records",
        "long",
        "1000000",
        "commit earlier once this many records are pending",
        positive,
    ),
    ConfigDef(
        PREFIX + "commit.max.bytes",
        "long",
        str(64 * 1024 * 1024),
        "commit earlier once this many bytes (Arrow) are pending",
        positive,
    ),
    ConfigDef(
        PREFIX + "convert.value.type",
        "string",
        "raw",
        "how values become columns",
        choices=("raw", "string", "json", "by_schema_id", "by_latest_schema"),
    ),
    ConfigDef(
        PREFIX + "convert.key.type",
        "string",
        "none",
        "how keys become the _kafka_key column (none: no such column)",
        choices=("none", "raw", "string", "json", "by_schema_id", "by_latest_schema"),
    ),
    ConfigDef(
        PREFIX + "convert.key.subject",
        "string",
        "",
        "by_latest_schema keys: the Schema Registry subject (default <topic>-key)",
    ),
    ConfigDef(
        PREFIX + "transform.value.type",
        "string",
        "flatten",
        "flatten: value fields are columns; none: one _kafka_value column; flatten_debezium:"
        " Debezium change events unwrapped, with a _cdc column",
        choices=("none", "flatten", "flatten_debezium"),
    ),
    *(
        ConfigDef(
            PREFIX + f"convert.{part}.message.full.name",
            "string",
            "",
            f"by_latest_schema Protobuf {part}s: the message type (default: the file's first)",
        )
        for part in ("key", "value")
    ),
    ConfigDef(
        PREFIX + "convert.value.subject",
        "string",
        "",
        "by_latest_schema: the Schema Registry subject (default <topic>-value)",
    ),
    ConfigDef(
        PREFIX + "errors.tolerance",
        "string",
        "invalid_data",
        "none: stop the partition; invalid_data/all: bad records go to the DLQ",
        choices=("none", "invalid_data", "all"),
    ),
    ConfigDef(PREFIX + "dlq.topic", "string", "", "dead-letter topic (default <topic>.dlq)"),
    ConfigDef(
        PREFIX + "partition.by",
        "string",
        "",
        "Iceberg partition spec, e.g. [bucket(id, 16), day(ts)] (tabletopic.partitioning)",
        lambda v: _layout_ok(parse_partition_by, v),
    ),
    ConfigDef(
        PREFIX + "sort.by",
        "string",
        "",
        "Iceberg sort order, e.g. [ts desc, id]; each file is sorted by it",
        lambda v: _layout_ok(parse_sort_by, v),
    ),
    ConfigDef(
        PREFIX + "upsert.enable",
        "boolean",
        "false",
        "the table holds the latest row per id.columns key (tabletopic.upsert)",
    ),
    ConfigDef(
        PREFIX + "id.columns",
        "string",
        "",
        "upsert key columns, e.g. [region, name]",
        lambda v: _layout_ok(parse_id_columns, v),
    ),
    ConfigDef(
        PREFIX + "cdc.field",
        "string",
        "",
        "column holding the operation (I, U, D); default _cdc.op with flatten_debezium",
    ),
)


def _layout_ok(parse: Callable[[str], object], value: str) -> bool:
    try:
        parse(value)
    except LayoutError as e:
        raise ConfigError(f"invalid value {value!r} for {PREFIX}{e}") from None
    return True


def register() -> None:
    """Make the broker accept (and DescribeConfigs list) the table.topic.* keys."""
    TOPIC_CONFIGS.register(OWNER, TABLE_TOPIC_CONFIGS, ALIASES)


register()

_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")


def default_table_name(topic: str) -> str:
    """Iceberg engines dislike dots and dashes in names (AutoMQ #3212): use underscores."""
    name = _NOT_IDENT.sub("_", topic)
    return name if not name[0].isdigit() else f"t_{name}"


@dataclass(frozen=True)
class TableTopicConfig:
    enabled: bool
    namespace: str
    table: str
    commit_interval_s: float
    commit_max_records: int
    commit_max_bytes: int
    value_type: str  # raw | string | json | by_schema_id | by_latest_schema
    tolerance: str  # none | invalid_data | all
    dlq_topic: str
    value_subject: str = ""  # by_latest_schema: the subject whose latest version reads values
    key_type: str = "none"  # none (no _kafka_key column) | raw | string | json | by_schema_id | ...
    key_subject: str = ""  # by_latest_schema keys
    transform: str = "flatten"  # flatten | none (one _kafka_value column) | flatten_debezium
    value_message: str = ""  # by_latest_schema Protobuf: the message's full name ("": first)
    key_message: str = ""
    layout: Layout = field(default_factory=Layout)
    upsert: bool = False
    id_columns: tuple[str, ...] = ()
    cdc_field: str = ""  # "": none, or _cdc.op with flatten_debezium

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.table)

    @classmethod
    def of(cls, topic: str, config: TopicConfig | Mapping[str, str]) -> TableTopicConfig:
        """The table-topic view of a topic's parsed configs (or of raw ones, parsed here)."""
        if not isinstance(config, TopicConfig):
            config = TopicConfig.parse(config)

        def num(key: str) -> int:
            v = config.get(PREFIX + key)
            assert isinstance(v, int)
            return v

        def text(key: str) -> str:
            return str(config.get(PREFIX + key))

        return cls(
            enabled=config.get(PREFIX + "enable") is True,
            namespace=text("namespace") or "default",
            table=text("name") or default_table_name(topic),
            commit_interval_s=num("commit.interval.ms") / 1000,
            commit_max_records=num("commit.max.records"),
            commit_max_bytes=num("commit.max.bytes"),
            value_type=text("convert.value.type"),
            tolerance=text("errors.tolerance"),
            dlq_topic=text("dlq.topic") or f"{topic}.dlq",
            value_subject=text("convert.value.subject") or f"{topic}-value",
            key_type=text("convert.key.type"),
            key_subject=text("convert.key.subject") or f"{topic}-key",
            transform=text("transform.value.type"),
            value_message=text("convert.value.message.full.name"),
            key_message=text("convert.key.message.full.name"),
            layout=Layout(parse_partition_by(text("partition.by")),
                          parse_sort_by(text("sort.by"))),
            upsert=config.get(PREFIX + "upsert.enable") is True,
            id_columns=parse_id_columns(text("id.columns")),
            cdc_field=text("cdc.field")
            or ("_cdc.op" if text("transform.value.type") == "flatten_debezium" else ""),
        )
