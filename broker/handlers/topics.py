"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37)."""

from __future__ import annotations

import uuid

from kio.schema.delete_topics.v6 import request as delete_topics_v6

from broker.config import TOPIC_BROKER_DEFAULTS, TOPIC_CONFIGS, topic_defaults
from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from broker.handlers.base import (
    ZERO_MS,
    BrokerContext,
    api,
    build,
    nested,
    nested_or_none,
    resp,
)
from broker.protocol.codec import RequestHead

CONFIG_SOURCE_TOPIC = 1
CONFIG_SOURCE_STATIC_BROKER = 4
CONFIG_SOURCE_DEFAULT = 5
# Apache Kafka refuses a CreateTopics / CreatePartitions request that would add more than
# 10,000 partitions in all (KAFKA-17870, KAFKA-19673): one request must not make the broker
# create millions of partitions (one hostile int32 would otherwise hold the metadata store).
MAX_PARTITIONS_PER_REQUEST = 10_000
TOO_MANY_PARTITIONS = "Excessively large number of partitions per request."
BROKER_COUNT = 1


@api(CREATE_TOPICS, 2, 7)
async def create_topics(
    ctx: BrokerContext, head: RequestHead, req: CreateTopicsRequest
) -> CreateTopicsResponse:
    storage = ctx.storage
    result_cls = nested(head, "CreatableTopicResult")
    results = []
    seen: set[str] = set()
    default_partitions = ctx.settings.num_partitions
    too_many = sum(
        len(t.assignments) if t.assignments else
        default_partitions if t.num_partitions == -1 else max(t.num_partitions, 0)
        for t in req.topics
    ) > MAX_PARTITIONS_PER_REQUEST
    for t in req.topics:
        topic_id: uuid.UUID | None = None
        partitions: int = t.num_partitions
        rf: int = t.replication_factor
        configs = {c.name: c.value for c in t.configs}
        code, message = ErrorCode.none, None
        try:
            if too_many:
                raise KafkaError(ErrorCode.policy_violation, TOO_MANY_PARTITIONS)
            if t.name in seen:
                raise KafkaError(ErrorCode.invalid_request, f"topic {t.name!r} given twice")
            seen.add(t.name)
            if t.assignments:
                if partitions != -1 or rf != -1:
                    raise KafkaError(
                        ErrorCode.invalid_request,
                        "both assignments and partitions/replication factor given",
                    )
                partitions = len(t.assignments)
                rf = len(t.assignments[0].broker_ids)
                if any(set(a.broker_ids) - {ctx.node_id} for a in t.assignments):
                    raise KafkaError(
                        ErrorCode.invalid_replica_assignment, f"only broker {ctx.node_id} exists"
                    )
            if partitions == -1:
                partitions = ctx.settings.num_partitions
            if rf == -1:
                rf = ctx.settings.default_replication_factor
            if rf <= 0 or rf > BROKER_COUNT:
                raise KafkaError(
                    ErrorCode.invalid_replication_factor,
                    f"Replication factor: {rf} larger than available brokers: {BROKER_COUNT}."
                    if rf > 0
                    else f"Replication factor must be positive, got {rf}",
                )
            if req.validate_only:
                storage.check_new_topic(t.name, partitions, configs)
            else:
                topic_id = (await storage.create_topic(t.name, partitions, configs)).topic_id
        except KafkaError as e:
            code, message = e.code, e.message
        config_entries = None
        if code == ErrorCode.none:
            entry_cls = nested_or_none(head, "CreatableTopicConfigs")
            if entry_cls is not None:
                config_entries = tuple(
                    build(
                        entry_cls,
                        name=name,
                        value=value,
                        read_only=False,
                        is_sensitive=False,
                        config_source=source,
                    )
                    for name, value, source in _effective_configs(ctx, configs)
                )
        results.append(
            build(
                result_cls,
                name=t.name,
                topic_id=topic_id or uuid.UUID(int=0),
                error_code=code,
                error_message=message,
                topic_config_error_code=ErrorCode.none,
                num_partitions=partitions if code == ErrorCode.none else -1,
                replication_factor=rf if code == ErrorCode.none else -1,
                configs=config_entries,
            )
        )
    return build(resp(head, CREATE_TOPICS), throttle_time=ZERO_MS, topics=tuple(results))


@api(DELETE_TOPICS, 1, 6)
async def delete_topics(
    ctx: BrokerContext, head: RequestHead, req: DeleteTopicsRequest
) -> DeleteTopicsResponse:
    storage = ctx.storage
    result_cls = nested(head, "DeletableTopicResult")
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if isinstance(req, delete_topics_v6.DeleteTopicsRequest):  # by name or id
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    results = []
    for name, tid in wanted:
        code, message = ErrorCode.none, None
        try:
            if name is None:
                topic = storage.topics_by_id.get(tid) if tid is not None else None
                if topic is None:
                    raise KafkaError(ErrorCode.unknown_topic_id, f"unknown topic id {tid}")
                name = topic.name
            tid = storage.topic(name).topic_id
            await storage.delete_topic(name)
            await ctx.offsets.forget_topic(name)
        except KafkaError as e:
            code, message = e.code, e.message
        results.append(
            build(
                result_cls,
                name=name,
                topic_id=tid or uuid.UUID(int=0),
                error_code=code,
                error_message=message,
            )
        )
    return build(resp(head, DELETE_TOPICS), throttle_time=ZERO_MS, responses=tuple(results))


@api(CREATE_PARTITIONS, 0, 3)
async def create_partitions(
    ctx: BrokerContext, head: RequestHead, req: CreatePartitionsRequest
) -> CreatePartitionsResponse:
    result_cls = nested(head, "CreatePartitionsTopicResult")
    results = []
    existing = ctx.storage.topics
    too_many = sum(
        t.count - len(existing[t.name].streams) if t.name in existing else max(t.count, 0)
        for t in req.topics
    ) > MAX_PARTITIONS_PER_REQUEST
    for t in req.topics:
        code, message = ErrorCode.none, None
        try:
            if too_many:
                raise KafkaError(ErrorCode.policy_violation, TOO_MANY_PARTITIONS)
            await ctx.storage.create_partitions(t.name, t.count, req.validate_only)
        except KafkaError as e:
            code, message = e.code, e.message
        results.append(build(result_cls, name=t.name, error_code=code, error_message=message))
    return build(resp(head, CREATE_PARTITIONS), throttle_time=ZERO_MS, results=tuple(results))


def _effective_configs(
    ctx: BrokerContext, configs: dict[str, str | None]
) -> list[tuple[str, str | None, int]]:
    """(name, value, source) of every topic config of a new topic, as DescribeConfigs would
    answer: set on the topic, else the broker setting it defaults to, else Kafka's default."""
    broker = topic_defaults(ctx.settings)
    out = []
    for name, d in sorted(TOPIC_CONFIGS.items()):
        if name in configs:
            out.append((name, configs[name], CONFIG_SOURCE_TOPIC))
        elif name in TOPIC_BROKER_DEFAULTS:
            broker_key = TOPIC_BROKER_DEFAULTS[name]
            set_on_broker = ctx.settings.sources.get(broker_key, "default") != "default"
            source = CONFIG_SOURCE_STATIC_BROKER if set_on_broker else CONFIG_SOURCE_DEFAULT
            out.append((name, broker.get(name, d.default), source))
        else:
            out.append((name, d.default, CONFIG_SOURCE_DEFAULT))
    return out
