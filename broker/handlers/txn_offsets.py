"""TxnOffsetCommit (28): a consumer group's offsets as part of a transaction, pending until it
commits (OffsetFetch answers them only then; an abort drops them). Sent to the group's
coordinator, as in Kafka (NOT_COORDINATOR elsewhere), which may not be the transaction's."""

from __future__ import annotations

from kio.schema.txn_offset_commit.v0 import request as v0
from kio.schema.txn_offset_commit.v1 import request as v1
from kio.schema.txn_offset_commit.v3 import request as v3

from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import MAX_METADATA_BYTES
from broker.groups.tablegroups import refuse
from broker.handlers.apitypes import (
    TXN_OFFSET_COMMIT,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.handlers.coordination import require_here
from broker.handlers.offsets import commit_errors
from broker.handlers.txn import coordinator, fenced_code
from broker.protocol.codec import RequestHead


@api(TXN_OFFSET_COMMIT, 0, 3)
async def txn_offset_commit(
    ctx: BrokerContext, head: RequestHead, req: TxnOffsetCommitRequest
) -> TxnOffsetCommitResponse:
    codes: dict[tuple[str, int], ErrorCode] = {}
    entries: list[tuple[str, int, int, int, str | None]] = []
    for t in req.topics:
        for p in t.partitions:
            code = ErrorCode.none
            try:
                ctx.storage.stream_id(t.name, p.partition_index)
                if p.committed_metadata and (
                    len(p.committed_metadata.encode()) > MAX_METADATA_BYTES
                ):
                    raise KafkaError(ErrorCode.offset_metadata_too_large)
                epoch = (
                    -1
                    if isinstance(p, v0.TxnOffsetCommitRequestPartition
                                  | v1.TxnOffsetCommitRequestPartition)
                    else p.committed_leader_epoch
                )
                entries.append(
                    (t.name, p.partition_index, p.committed_offset, epoch, p.committed_metadata)
                )
            except KafkaError as e:
                code = e.code
            codes[(t.name, p.partition_index)] = code
    try:
        refuse(req.group_id)  # floe-table.*: a table's read-only group
        await require_here(ctx, req.group_id)  # the group's coordinator takes them
        if isinstance(req, v3.TxnOffsetCommitRequest) and req.generation_id >= 0:
            # a member of a live generation (KIP-447); -1: not checked, as in Kafka
            ctx.groups.check_commit(
                req.group_id, req.generation_id, req.member_id, req.group_instance_id
            )
        if entries:
            await coordinator(ctx).txn_offset_commit(
                req.transactional_id, req.group_id, req.producer_id, req.producer_epoch, entries
            )
    except KafkaError as e:
        failed = fenced_code(e.code, head, 3)
        for name, index, *_ in entries:
            codes[(name, index)] = failed
    part_cls = nested(head, "TxnOffsetCommitResponsePartition")
    topic_cls = nested(head, "TxnOffsetCommitResponseTopic")
    topics = commit_errors(topic_cls, part_cls, req.topics, codes)
    return build(resp(head, TXN_OFFSET_COMMIT), throttle_time=ZERO_MS, topics=topics)
