"""A topic's table-topic settings (keys `table.topic.*`, AutoMQ's `automq.table.topic.*` too)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker.config import topic_config_value

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

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.table)

    @classmethod
    def of(cls, topic: str, configs: dict[str, str]) -> TableTopicConfig:
        def get(key: str) -> object:
            return topic_config_value(configs, f"table.topic.{key}")

        interval = get("commit.interval.ms")
        max_records = get("commit.max.records")
        max_bytes = get("commit.max.bytes")
        assert isinstance(interval, int) and isinstance(max_records, int)
        assert isinstance(max_bytes, int)
        return cls(
            enabled=bool(get("enable")),
            namespace=str(get("namespace")) or "default",
            table=str(get("name")) or default_table_name(topic),
            commit_interval_s=interval / 1000,
            commit_max_records=max_records,
            commit_max_bytes=max_bytes,
            value_type=str(get("convert.value.type")),
            tolerance=str(get("errors.tolerance")),
            dlq_topic=str(get("dlq.topic")) or f"{topic}.dlq",
            value_subject=str(get("convert.value.subject")) or f"{topic}-value",
        )
