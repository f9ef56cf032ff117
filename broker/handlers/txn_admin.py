"""DescribeTransactions (65), ListTransactions (66): the coordinator's state, for operators
(kafka-transactions.sh, AdminClient). In a cluster each broker describes and lists the
transactional ids it coordinates (others: NOT_COORDINATOR)."""

from __future__ import annotations

import datetime

from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import (
    DESCRIBE_TRANSACTIONS,
    LIST_TRANSACTIONS,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.handlers.txn import coordinator
from broker.protocol.codec import RequestHead
from broker.txn.state import TxnState

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@api(DESCRIBE_TRANSACTIONS, 0, 0)
async def describe_transactions(
    ctx: BrokerContext, head: RequestHead, req: DescribeTransactionsRequest
) -> DescribeTransactionsResponse:
    state_cls = nested(head, "TransactionState")
    topic_cls = nested(head, "TopicData")
    out = []
    for tid in req.transactional_ids:
        try:
            await coordinator(ctx).here(tid)  # NOT_COORDINATOR: placed on another broker
            meta = coordinator(ctx).txns.get(tid)
            if meta is None:
                raise KafkaError(ErrorCode.transactional_id_not_found)
        except KafkaError as e:
            out.append(build(state_cls, error_code=e.code, transactional_id=tid,
                             transaction_state="", transaction_timeout=ZERO_MS,
                             transaction_start_time=EPOCH, producer_id=-1, producer_epoch=-1,
                             topics=()))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(meta.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out.append(build(
            state_cls,
            error_code=ErrorCode.none,
            transactional_id=tid,
            transaction_state=meta.state.value,
            transaction_timeout=datetime.timedelta(milliseconds=meta.timeout_ms),
            transaction_start_time=EPOCH + datetime.timedelta(milliseconds=max(meta.start_ms, 0)),
            producer_id=meta.producer_id,
            producer_epoch=meta.epoch,
            topics=tuple(build(topic_cls, topic=t, partitions=tuple(ps))
                         for t, ps in by_topic.items()),
        ))
    return build(resp(head, DESCRIBE_TRANSACTIONS), throttle_time=ZERO_MS,
                 transaction_states=tuple(out))


@api(LIST_TRANSACTIONS, 0, 0)
async def list_transactions(
    ctx: BrokerContext, head: RequestHead, req: ListTransactionsRequest
) -> ListTransactionsResponse:
    state_cls = nested(head, "TransactionState")
    known = {s.value for s in TxnState}
    unknown = tuple(s for s in req.state_filters if s not in known)
    states = set(req.state_filters) - set(unknown)
    pids = set(req.producer_id_filters)
    code, found = ErrorCode.none, []
    try:
        await coordinator(ctx).sync()  # the ids this broker coordinates now
        for tid, meta in sorted(coordinator(ctx).txns.items()):
            if not coordinator(ctx).is_local(tid):
                continue
            if (req.state_filters and meta.state.value not in states) or (
                pids and meta.producer_id not in pids
            ):
                continue
            found.append(build(state_cls, transactional_id=tid, producer_id=meta.producer_id,
                               transaction_state=meta.state.value))
    except KafkaError as e:
        code = e.code
    return build(resp(head, LIST_TRANSACTIONS), throttle_time=ZERO_MS, error_code=code,
                 unknown_state_filters=unknown, transaction_states=tuple(found))
