"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44)."""

from __future__ import annotations

from collections.abc import Sequence

from kio.schema.describe_configs.v1 import request as describe_configs_v1
from kio.schema.describe_configs.v2 import request as describe_configs_v2

from broker.config import (
    BROKER_CONFIGS,
    TOPIC_BROKER_DEFAULTS,
    TOPIC_CONFIGS,
    ConfigDef,
    canonical_topic_config,
)
from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import (
    ALTER_CONFIGS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, Entity, api, build, nested, resp
from broker.protocol.codec import RequestHead

TOPIC, BROKER = 2, 4
SOURCE_TOPIC, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 4, 5
CONFIG_TYPES = {
    "boolean": 1,
    "string": 2,
    "int": 3,
    "long": 5,
    "double": 6,
    "list": 7,
    "password": 9,
}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _entry(
    head: RequestHead,
    req: DescribeConfigsRequest,
    d: ConfigDef,
    value: str | None,
    source: int,
    read_only: bool,
    chain: tuple[tuple[str, str | None, int], ...] | None = None,
) -> Entity:
    """One config of a DescribeConfigs answer; `chain` lists its synonyms, most specific
    first (name, value, source), like Kafka's (default: this key at `source`, then default)."""
    synonyms: tuple[Entity, ...] = ()
    if req.include_synonyms:
        syn = nested(head, "DescribeConfigsSynonym")
        if chain is None:
            chain = ((d.name, value, source),)
            if source != SOURCE_DEFAULT:
                chain += ((d.name, d.default, SOURCE_DEFAULT),)
        synonyms = tuple(build(syn, name=n, value=v, source=s) for n, v, s in chain)
    return build(
        nested(head, "DescribeConfigsResourceResult"),
        name=d.name,
        value=value,
        read_only=read_only,
        config_source=source,
        is_sensitive=False,
        synonyms=synonyms,
        config_type=CONFIG_TYPES.get(d.type, 0),
        documentation=d.doc or None if _wants_documentation(req) else None,
    )


def _wants_documentation(req: DescribeConfigsRequest) -> bool:
    old = describe_configs_v1.DescribeConfigsRequest | describe_configs_v2.DescribeConfigsRequest
    return not isinstance(req, old) and req.include_documentation


@api(DESCRIBE_CONFIGS, 1, 4)
async def describe_configs(
    ctx: BrokerContext, head: RequestHead, req: DescribeConfigsRequest
) -> DescribeConfigsResponse:
    results = []
    for r in req.resources:
        code, message = ErrorCode.none, None
        entries: list[Entity] = []
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        try:
            if r.resource_type == TOPIC:
                topic = ctx.storage.topic(r.resource_name)
                for name, d in sorted(TOPIC_CONFIGS.items()):
                    if keys is None or name in keys:
                        entries.append(_topic_entry(ctx, head, req, topic.configs, d))
            elif r.resource_type == BROKER:
                if r.resource_name not in ("", str(ctx.node_id)):
                    raise KafkaError(
                        ErrorCode.invalid_request,
                        f"this is broker {ctx.node_id}, not {r.resource_name}",
                    )
                for name, d in sorted(BROKER_CONFIGS.items()):
                    if keys is None or name in keys:
                        from_default = ctx.settings.sources[name] == "default"
                        value = ctx.settings.values[name]
                        entries.append(
                            _entry(
                                head,
                                req,
                                d,
                                None if value is None else _fmt(value),
                                SOURCE_DEFAULT if from_default else SOURCE_STATIC_BROKER,
                                True,
                            )
                        )
            else:
                raise KafkaError(
                    ErrorCode.invalid_request, f"resource type {r.resource_type} is not supported"
                )
        except KafkaError as e:
            code, message, entries = e.code, e.message, []
        results.append(
            build(
                nested(head, "DescribeConfigsResult"),
                error_code=code,
                error_message=message,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=tuple(entries),
            )
        )
    return build(resp(head, DESCRIBE_CONFIGS), throttle_time=ZERO_MS, results=tuple(results))


def _topic_entry(
    ctx: BrokerContext,
    head: RequestHead,
    req: DescribeConfigsRequest,
    configs: dict[str, str],
    d: ConfigDef,
) -> Entity:
    """A topic config as Kafka describes it: set on the topic (TOPIC_CONFIG), else from its
    broker synonym (e.g. message.max.bytes: STATIC_BROKER_CONFIG if the broker setting was
    given, else DEFAULT_CONFIG with the broker's default)."""
    chain: list[tuple[str, str | None, int]] = []
    set_value = configs.get(d.name)
    if set_value is not None:
        chain.append((d.name, set_value, SOURCE_TOPIC))
    broker_key = TOPIC_BROKER_DEFAULTS.get(d.name)
    if broker_key is not None:
        if ctx.settings.sources.get(broker_key, "default") != "default":
            chain.append((broker_key, _fmt(ctx.settings.values[broker_key]), SOURCE_STATIC_BROKER))
        chain.append((broker_key, BROKER_CONFIGS[broker_key].default, SOURCE_DEFAULT))
    else:
        chain.append((d.name, d.default, SOURCE_DEFAULT))
    _, value, source = chain[0]
    return _entry(head, req, d, value, source, False, tuple(chain))


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


# (resource type, resource name, [(config name, operation, value)]) of an Alter request
Changes = Sequence[tuple[int, str, Sequence[tuple[str, int, str | None]]]]


async def _alter(
    ctx: BrokerContext, head: RequestHead, changes: Changes, validate_only: bool, incremental: bool
) -> tuple[Entity, ...]:
    results = []
    for resource_type, resource_name, configs_given in changes:
        code, message = ErrorCode.none, None
        try:
            if resource_type != TOPIC:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    "only topic configs can be altered (broker settings are static)",
                )
            topic = ctx.storage.topic(resource_name)
            configs = dict(topic.configs) if incremental else {}
            for given_name, op, value in configs_given:
                name = canonical_topic_config(given_name)
                if name not in TOPIC_CONFIGS:
                    raise KafkaError(
                        ErrorCode.invalid_config, f"Unknown topic config name: {given_name}"
                    )
                if op == SET:
                    if value is None:
                        raise KafkaError(ErrorCode.invalid_config, f"null value for {given_name}")
                    configs[name] = value
                elif op == DELETE:
                    configs.pop(name, None)
                elif op in (APPEND, SUBTRACT):
                    d = TOPIC_CONFIGS[name]
                    if d.type != "list":
                        raise KafkaError(
                            ErrorCode.invalid_config,
                            f"{given_name} is not a list; cannot APPEND/SUBTRACT",
                        )
                    current = [v for v in configs.get(name, d.default or "").split(",") if v]
                    values = [v for v in (value or "").split(",") if v]
                    if op == APPEND:
                        current += [v for v in values if v not in current]
                    else:
                        current = [v for v in current if v not in values]
                    configs[name] = ",".join(current)
                else:
                    raise KafkaError(ErrorCode.invalid_request, f"config operation {op}")
            await ctx.storage.set_topic_configs(resource_name, configs, validate_only)
        except KafkaError as e:
            code, message = e.code, e.message
        results.append(
            build(
                nested(head, "AlterConfigsResourceResponse"),
                error_code=code,
                error_message=message,
                resource_type=resource_type,
                resource_name=resource_name,
            )
        )
    return tuple(results)


@api(INCREMENTAL_ALTER_CONFIGS, 0, 1)
async def incremental_alter_configs(
    ctx: BrokerContext, head: RequestHead, req: IncrementalAlterConfigsRequest
) -> IncrementalAlterConfigsResponse:
    changes = [
        (
            r.resource_type,
            r.resource_name,
            [(c.name, c.config_operation, c.value) for c in r.configs],
        )
        for r in req.resources
    ]
    results = await _alter(ctx, head, changes, req.validate_only, incremental=True)
    return build(resp(head, INCREMENTAL_ALTER_CONFIGS), throttle_time=ZERO_MS, responses=results)


@api(ALTER_CONFIGS, 0, 2)
async def alter_configs(
    ctx: BrokerContext, head: RequestHead, req: AlterConfigsRequest
) -> AlterConfigsResponse:
    changes = [
        (r.resource_type, r.resource_name, [(c.name, SET, c.value) for c in r.configs])
        for r in req.resources
    ]
    results = await _alter(ctx, head, changes, req.validate_only, incremental=False)
    return build(resp(head, ALTER_CONFIGS), throttle_time=ZERO_MS, responses=results)
