"""DeleteRecords (21): move log start offsets forward (offset -1: the high watermark)."""

from __future__ import annotations

from typing import Any

from broker.errors import ErrorCode, KafkaError
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.protocol.codec import RequestHead


@api(21, 0, 2)
async def delete_records(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    storage = ctx.storage
    part_cls = nested(head, "DeleteRecordsPartitionResult")
    topic_cls = nested(head, "DeleteRecordsTopicResult")
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, low = ErrorCode.none, -1
            try:
                sid = storage.stream_id(t.name, p.partition_index)
                start, end = storage.offsets(t.name, p.partition_index)
                target = end if p.offset == -1 else p.offset
                if not 0 <= target <= end:
                    raise KafkaError(
                        ErrorCode.offset_out_of_range,
                        f"offset {p.offset} beyond the high watermark {end}",
                    )
                low = await storage.log.truncate(sid, target) if target > start else start
            except KafkaError as e:
                code = e.code
            parts.append(
                build(
                    part_cls, partition_index=p.partition_index, low_watermark=low, error_code=code
                )
            )
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(resp(head), throttle_time=ZERO_MS, topics=tuple(topics))
