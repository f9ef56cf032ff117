"""AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26): the producer's side of a
transaction, answered by the transaction coordinator (broker.txn.coordinator)."""

from __future__ import annotations

from broker.errors import ErrorCode, KafkaError
from broker.groups.tablegroups import refuse
from broker.handlers.apitypes import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.protocol.codec import RequestHead
from broker.txn.coordinator import TxnCoordinator


def fenced_code(code: ErrorCode, head: RequestHead, since: int) -> ErrorCode:
    """PRODUCER_FENCED for the versions that know it (from `since`), else, as Kafka answers
    older clients, INVALID_PRODUCER_EPOCH."""
    if code == ErrorCode.producer_fenced and head.api_version < since:
        return ErrorCode.invalid_producer_epoch
    return code


def coordinator(ctx: BrokerContext) -> TxnCoordinator:
    if ctx.txn is None:
        raise KafkaError(ErrorCode.coordinator_not_available, "no transaction coordinator")
    return ctx.txn


@api(ADD_PARTITIONS_TO_TXN, 0, 3)
async def add_partitions_to_txn(
    ctx: BrokerContext, head: RequestHead, req: AddPartitionsToTxnRequest
) -> AddPartitionsToTxnResponse:
    wanted: list[tuple[str, int]] = [
        (t.name, p) for t in req.v3_and_below_topics for p in t.partitions
    ]
    try:
        codes = await coordinator(ctx).add_partitions(
            req.v3_and_below_transactional_id,
            req.v3_and_below_producer_id,
            req.v3_and_below_producer_epoch,
            wanted,
        )
    except KafkaError as e:
        codes = dict.fromkeys(wanted, fenced_code(e.code, head, 2))
    part_cls = nested(head, "AddPartitionsToTxnPartitionResult")
    topic_cls = nested(head, "AddPartitionsToTxnTopicResult")
    by_topic: dict[str, list[int]] = {}
    for topic, partition in wanted:
        by_topic.setdefault(topic, []).append(partition)
    results = tuple(
        build(
            topic_cls,
            name=topic,
            results_by_partition=tuple(
                build(part_cls, partition_index=p, partition_error_code=codes[(topic, p)])
                for p in parts
            ),
        )
        for topic, parts in by_topic.items()
    )
    return build(
        resp(head, ADD_PARTITIONS_TO_TXN),
        throttle_time=ZERO_MS,
        results_by_topic_v3_and_below=results,
    )


@api(ADD_OFFSETS_TO_TXN, 0, 3)
async def add_offsets_to_txn(
    ctx: BrokerContext, head: RequestHead, req: AddOffsetsToTxnRequest
) -> AddOffsetsToTxnResponse:
    code = ErrorCode.none
    try:
        refuse(req.group_id)  # floe-table.*: a table's read-only group
        await coordinator(ctx).add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id
        )
    except KafkaError as e:
        code = fenced_code(e.code, head, 2)
    return build(resp(head, ADD_OFFSETS_TO_TXN), throttle_time=ZERO_MS, error_code=code)


@api(END_TXN, 0, 3)
async def end_txn(ctx: BrokerContext, head: RequestHead, req: EndTxnRequest) -> EndTxnResponse:
    code = ErrorCode.none
    try:
        await coordinator(ctx).end_txn(
            req.transactional_id, req.producer_id, req.producer_epoch, req.committed
        )
    except KafkaError as e:
        code = fenced_code(e.code, head, 2)
    return build(resp(head, END_TXN), throttle_time=ZERO_MS, error_code=code)
