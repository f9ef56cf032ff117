"""Metadata (3) and DescribeCluster (60): the live brokers and each partition's leader and
leader epoch (broker.cluster, through the engine's `cluster_view`; an engine without one: this
broker leads every partition). A partition whose leader is not live answers
LEADER_NOT_AVAILABLE with leader -1 (clients ask again)."""

from __future__ import annotations

import uuid

from kio.schema.describe_cluster.v0.request import DescribeClusterRequest as DescribeClusterV0
from kio.schema.metadata.v0.request import MetadataRequest as MetadataV0
from kio.schema.metadata.v1.request import MetadataRequest as MetadataV1
from kio.schema.metadata.v2.request import MetadataRequest as MetadataV2
from kio.schema.metadata.v3.request import MetadataRequest as MetadataV3
from kio.schema.metadata.v10.request import MetadataRequestTopic as MetadataTopicV10
from kio.schema.metadata.v11.request import MetadataRequestTopic as MetadataTopicV11
from kio.schema.metadata.v12.request import MetadataRequestTopic as MetadataTopicV12

from broker.cluster.model import NO_LEADER, BrokerInfo, ClusterView
from broker.cluster.racks import read_replicas
from broker.engine import Topic, check_topic_name
from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import (
    DESCRIBE_CLUSTER,
    METADATA,
    DescribeClusterRequest,
    DescribeClusterResponse,
    MetadataRequest,
    MetadataResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, Entity, api, build, nested, resp
from broker.protocol.codec import RequestHead

AUTHORIZED_OPS_OMITTED = -(2**31)


def _brokers(ctx: BrokerContext, view: ClusterView | None) -> list[BrokerInfo]:
    """The live brokers, this one with the address it answers on."""
    me = BrokerInfo(ctx.node_id, ctx.host, ctx.port, ctx.settings.broker_rack)
    others = [] if view is None else [b for b in view.brokers if b.node_id != ctx.node_id]
    return sorted([me, *others], key=lambda b: b.node_id)


def _leader(ctx: BrokerContext, view: ClusterView | None, live: set[int], sid: int
            ) -> tuple[int, int]:
    """(leader node id or NO_LEADER when it is not live, leader epoch)."""
    if view is None:
        return ctx.node_id, 0
    lead = view.leaders.get(sid)
    if lead is None:
        return NO_LEADER, 0
    return (lead.node_id if lead.node_id in live else NO_LEADER), lead.epoch


def _partitions(
    ctx: BrokerContext, head: RequestHead, topic: Topic, view: ClusterView | None,
    live: set[int],
) -> tuple[Entity, ...]:
    part = nested(head, "MetadataResponsePartition")
    out = []
    for i, sid in enumerate(topic.streams):
        node, epoch = _leader(ctx, view, live, sid)
        nodes: tuple[int, ...] = (node,) if node != NO_LEADER else ()
        if nodes and view is not None and ctx.settings.replica_selector_class:
            nodes += tuple(read_replicas(view.brokers, node, sid))  # KIP-392: see .racks
        out.append(build(
            part,
            error_code=ErrorCode.none if nodes else ErrorCode.leader_not_available,
            partition_index=i,
            leader_id=node,
            leader_epoch=epoch,
            replica_nodes=nodes,
            isr_nodes=nodes,
            offline_replicas=(),
        ))
    return tuple(out)


def _topic(ctx: BrokerContext, head: RequestHead, topic: Topic) -> Entity:
    view = ctx.storage.cluster_view()
    live = {b.node_id for b in _brokers(ctx, view)}
    return build(
        nested(head, "MetadataResponseTopic"),
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=False,
        partitions=_partitions(ctx, head, topic, view, live),
        topic_authorized_operations=AUTHORIZED_OPS_OMITTED,
    )


def _error_topic(
    head: RequestHead, name: str | None, code: ErrorCode, topic_id: uuid.UUID | None = None
) -> Entity:
    return build(
        nested(head, "MetadataResponseTopic"),
        error_code=code,
        name=name,
        topic_id=topic_id or uuid.UUID(int=0),
        is_internal=False,
        partitions=(),
        topic_authorized_operations=AUTHORIZED_OPS_OMITTED,
    )


@api(METADATA, 0, 12)
async def metadata(
    ctx: BrokerContext, head: RequestHead, req: MetadataRequest
) -> MetadataResponse:
    storage = ctx.storage
    requested = req.topics
    if requested is not None and head.api_version == 0 and len(requested) == 0:
        requested = None  # v0: an empty list means all topics
    topics = []
    if requested is None:
        topics = [_topic(ctx, head, t) for t in storage.topics.values()]
    else:
        allow = (
            (isinstance(req, MetadataV0 | MetadataV1 | MetadataV2 | MetadataV3)
             or req.allow_auto_topic_creation)
            and ctx.settings.auto_create_topics_enable
        )
        for rt in requested:
            name = rt.name
            if name is None:  # by id: names are nullable from v10
                assert isinstance(rt, MetadataTopicV10 | MetadataTopicV11 | MetadataTopicV12)
                t = storage.topics_by_id.get(rt.topic_id) if rt.topic_id is not None else None
                topics.append(
                    _topic(ctx, head, t)
                    if t is not None
                    else _error_topic(head, None, ErrorCode.unknown_topic_id, rt.topic_id)
                )
                continue
            t = storage.topics.get(name)
            if t is None and allow:
                try:
                    check_topic_name(name)
                    t = await storage.create_topic(name, ctx.settings.num_partitions, {})
                except KafkaError as e:
                    if e.code != ErrorCode.topic_already_exists:
                        topics.append(_error_topic(head, name, e.code))
                        continue
                    t = storage.topics.get(name)
            if t is None:
                topics.append(_error_topic(head, name, ErrorCode.unknown_topic_or_partition))
            else:
                topics.append(_topic(ctx, head, t))
    view = storage.cluster_view()
    brokers = tuple(
        build(nested(head, "MetadataResponseBroker"), node_id=b.node_id, host=b.host,
              port=b.port, rack=b.rack)
        for b in _brokers(ctx, view)
    )
    return build(
        resp(head, METADATA),
        throttle_time=ZERO_MS,
        brokers=brokers,
        cluster_id=storage.cluster_id,
        controller_id=ctx.node_id if view is None else view.controller,
        topics=tuple(topics),
        cluster_authorized_operations=AUTHORIZED_OPS_OMITTED,
    )


@api(DESCRIBE_CLUSTER, 0, 1)
async def describe_cluster(
    ctx: BrokerContext, head: RequestHead, req: DescribeClusterRequest
) -> DescribeClusterResponse:
    if not isinstance(req, DescribeClusterV0) and req.endpoint_type != 1:
        return build(
            resp(head, DESCRIBE_CLUSTER),
            throttle_time=ZERO_MS,
            error_code=ErrorCode.unsupported_endpoint_type,
            error_message="only broker endpoints",
            endpoint_type=req.endpoint_type,
            cluster_id=ctx.storage.cluster_id,
            controller_id=-1,
            brokers=(),
            cluster_authorized_operations=AUTHORIZED_OPS_OMITTED,
        )
    view = ctx.storage.cluster_view()
    brokers = tuple(
        build(nested(head, "DescribeClusterBroker"), broker_id=b.node_id, host=b.host,
              port=b.port, rack=b.rack)
        for b in _brokers(ctx, view)
    )
    return build(
        resp(head, DESCRIBE_CLUSTER),
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=1,
        cluster_id=ctx.storage.cluster_id,
        controller_id=ctx.node_id if view is None else view.controller,
        brokers=brokers,
        cluster_authorized_operations=AUTHORIZED_OPS_OMITTED,
    )
