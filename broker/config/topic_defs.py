"""The topic configs the broker itself acts on (or accepts by design with no effect), Kafka's
names and defaults; registered as owner "broker" in `broker.config.topic.TOPIC_CONFIGS`.
Other packages register their own (tabletopic: `table.topic.*`)."""

from __future__ import annotations

from dataclasses import replace

from broker.config.defs import LONG_MAX, ConfigDef, min_minus1, nonneg, positive

_DEFS = [
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
        nonneg,
    ),
    ConfigDef("file.delete.delay.ms", "long", "60000", check=nonneg),
    ConfigDef("flush.messages", "long", LONG_MAX, check=positive),
    ConfigDef("flush.ms", "long", LONG_MAX, check=nonneg),
    ConfigDef("index.interval.bytes", "int", "4096", check=nonneg),
    ConfigDef(
        "max.compaction.lag.ms",
        "long",
        LONG_MAX,
        "clean a partition once its oldest uncleaned chunk is this old",
        positive,
    ),
    ConfigDef(
        "max.message.bytes",
        "int",
        "1048588",
        "largest record batch (default: the broker's message.max.bytes)",
        nonneg,
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
        nonneg,
    ),
    ConfigDef(
        "message.timestamp.before.max.ms",
        "long",
        LONG_MAX,
        "CreateTime records older than this: INVALID_TIMESTAMP",
        nonneg,
    ),
    ConfigDef(
        "message.timestamp.after.max.ms",
        "long",
        LONG_MAX,
        "CreateTime records further ahead than this: INVALID_TIMESTAMP",
        nonneg,
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
        nonneg,
    ),
    ConfigDef("min.insync.replicas", "int", "1", check=positive),
    ConfigDef("preallocate", "boolean", "false"),
    ConfigDef("retention.bytes", "long", "-1", check=min_minus1),
    ConfigDef("retention.ms", "long", "604800000", check=min_minus1),
    ConfigDef("segment.bytes", "int", "1073741824", check=lambda v: v >= 14),
    ConfigDef("segment.index.bytes", "int", "10485760", check=nonneg),
    ConfigDef("segment.jitter.ms", "long", "0", check=nonneg),
    ConfigDef("segment.ms", "long", "604800000", check=positive),
    ConfigDef("unclean.leader.election.enable", "boolean", "false"),
    ConfigDef("local.retention.ms", "long", "-2", check=lambda v: v >= -2),
    ConfigDef("local.retention.bytes", "long", "-2", check=lambda v: v >= -2),
    ConfigDef("remote.storage.enable", "boolean", "false"),
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


def broker_topic_configs() -> list[ConfigDef]:
    """The definitions, inert ones documented as such (DescribeConfigs shows the reason)."""
    return [
        replace(d, doc=f"accepted, no effect: {INERT_TOPIC_CONFIGS[d.name]}")
        if d.name in INERT_TOPIC_CONFIGS
        else d
        for d in _DEFS
    ]
