"""DeleteRecords (21): move log start offsets forward (offset -1: the high watermark)."""

from __future__ import annotations

from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import DELETE_RECORDS, DeleteRecordsRequest, DeleteRecordsResponse
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.protocol.codec import RequestHead


@api(DELETE_RECORDS, 0, 2)
async def delete_records(
    ctx: BrokerContext, head: RequestHead, req: DeleteRecordsRequest
) -> DeleteRecordsResponse:
    storage = ctx.storage
    part_cls = nested(head, "DeleteRecordsPartitionResult")
    topic_cls = nested(head, "DeleteRecordsTopicResult")
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, low = ErrorCode.none, -1
            try:
                low = await storage.delete_records(t.name, p.partition_index, p.offset)
            except KafkaError as e:
                code = e.code
            parts.append(
                build(
                    part_cls, partition_index=p.partition_index, low_watermark=low, error_code=code
                )
            )
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(resp(head, DELETE_RECORDS), throttle_time=ZERO_MS, topics=tuple(topics))
