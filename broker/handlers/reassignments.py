"""AlterPartitionReassignments (45) and ListPartitionReassignments (46), on floe's model: a
partition has one replica, its leader (the log is in the object store; no data moves).

A reassignment to `[N]` pins the partition's leader to broker N: the controller moves it there
(a new leader epoch, fenced like any move) at its next heartbeat while N is live, and never
balances it away; if N dies the partition goes elsewhere and comes back when N is live again
(broker.cluster.assignment, rule 0). The reassignment is ongoing until N leads it; the pin
stays after that. `replicas: null` cancels the pin (NO_REASSIGNMENT_IN_PROGRESS if there is
none). Refused with INVALID_REPLICA_ASSIGNMENT: an empty list, more than one broker (floe
keeps one replica: name exactly one), a node id no broker ever registered with. Any broker
takes the request (the pins are rows in the shared metadata database), not only the
controller.

ListPartitionReassignments answers the ongoing ones as Kafka does: `replicas` the target then
the current leader, `adding_replicas` the target, `removing_replicas` the current leader.
"""

from __future__ import annotations

from kio.schema.alter_partition_reassignments.v1 import request as alter_v1

from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import (
    ALTER_PARTITION_REASSIGNMENTS,
    LIST_PARTITION_REASSIGNMENTS,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.protocol.codec import RequestHead

NO_LEADER = -1


def _target(replicas: tuple[int, ...] | None) -> int | None:
    """The broker a reassignment names (None: a cancel), or INVALID_REPLICA_ASSIGNMENT."""
    if replicas is None:
        return None
    if len(replicas) != 1:
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         "a floe partition has one replica, its leader: name exactly one"
                         f" broker (got {list(replicas)})")
    if replicas[0] < 0:
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         f"invalid broker id {replicas[0]}")
    return int(replicas[0])


@api(ALTER_PARTITION_REASSIGNMENTS, 0, 1)
async def alter_partition_reassignments(
    ctx: BrokerContext, head: RequestHead, req: AlterPartitionReassignmentsRequest
) -> AlterPartitionReassignmentsResponse:
    part_cls = nested(head, "ReassignablePartitionResponse")
    topic_cls = nested(head, "ReassignableTopicResponse")
    errors: dict[tuple[str, int], KafkaError | None] = {}
    changes: list[tuple[str, int, int | None]] = []
    for t in req.topics:
        for p in t.partitions:
            try:
                changes.append((t.name, p.partition_index, _target(p.replicas)))
            except KafkaError as e:
                errors[(t.name, p.partition_index)] = e
    if changes:
        for (topic, partition, _), err in zip(
            changes, await ctx.storage.reassign_partitions(changes), strict=True
        ):
            errors[(topic, partition)] = err
    def answer(topic: str, partition: int) -> object:
        err = errors[(topic, partition)]
        return build(part_cls, partition_index=partition,
                     error_code=ErrorCode.none if err is None else err.code,
                     error_message=None if err is None else str(err))

    responses = tuple(
        build(topic_cls, name=t.name,
              partitions=tuple(answer(t.name, p.partition_index) for p in t.partitions))
        for t in req.topics)
    allow = (req.allow_replication_factor_change
             if isinstance(req, alter_v1.AlterPartitionReassignmentsRequest) else True)
    return build(resp(head, ALTER_PARTITION_REASSIGNMENTS), throttle_time=ZERO_MS,
                 allow_replication_factor_change=allow, error_code=ErrorCode.none,
                 error_message=None, responses=responses)


@api(LIST_PARTITION_REASSIGNMENTS, 0, 0)
async def list_partition_reassignments(
    ctx: BrokerContext, head: RequestHead, req: ListPartitionReassignmentsRequest
) -> ListPartitionReassignmentsResponse:
    part_cls = nested(head, "OngoingPartitionReassignment")
    topic_cls = nested(head, "OngoingTopicReassignment")
    wanted = None if req.topics is None else {
        (t.name, int(p)) for t in req.topics for p in t.partition_indexes}
    ongoing: dict[str, list[object]] = {}
    for topic, partition, leader, target in await ctx.storage.pinned_partitions():
        if leader == target or (wanted is not None and (topic, partition) not in wanted):
            continue
        removing = () if leader in (NO_LEADER, target) else (leader,)
        ongoing.setdefault(topic, []).append(build(
            part_cls, partition_index=partition, replicas=(target, *removing),
            adding_replicas=(target,), removing_replicas=removing))
    topics = tuple(build(topic_cls, name=t, partitions=tuple(parts))
                   for t, parts in sorted(ongoing.items()))
    return build(resp(head, LIST_PARTITION_REASSIGNMENTS), throttle_time=ZERO_MS,
                 error_code=ErrorCode.none, error_message=None, topics=topics)
