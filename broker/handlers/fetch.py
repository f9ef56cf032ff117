"""Fetch (1): long-poll reads of committed data within max_bytes / partition_max_bytes;
with isolation_level read_committed only up to the last stable offset, with the aborted
transactions of the range served (clients drop their records). ListOffsets (2)."""

from __future__ import annotations

import asyncio
import time

from kio.schema.list_offsets.v1 import request as list_offsets_v1

from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import (
    FETCH,
    LIST_OFFSETS,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, Later, Reply, api, build, nested, resp
from broker.protocol.codec import RequestHead
from broker.protocol.records import iter_headers

READ_COMMITTED = 1


@api(FETCH, 4, 12)
async def fetch(
    ctx: BrokerContext, head: RequestHead, req: FetchRequest
) -> Reply[FetchResponse]:
    wait_s = min(max(req.max_wait.total_seconds(), 0.0), ctx.max_wait_cap_s)
    return Later(_fetch(ctx, head, req, wait_s))


async def _fetch(
    ctx: BrokerContext, head: RequestHead, req: FetchRequest, wait_s: float
) -> FetchResponse:
    deadline = time.monotonic() + wait_s
    keys: list[tuple[str, int]] = [(t.topic, p.partition) for t in req.topics for p in t.partitions]
    while True:
        response, size, errors = await _collect(ctx, head, req)
        remaining = deadline - time.monotonic()
        if size >= req.min_bytes or errors or remaining <= 0 or not keys:
            return response
        await ctx.storage.wait_for_data(keys, remaining)


async def _collect(
    ctx: BrokerContext, head: RequestHead, req: FetchRequest
) -> tuple[FetchResponse, int, bool]:
    storage = ctx.storage
    part_cls = nested(head, "PartitionData")
    topic_cls = nested(head, "FetchableTopicResponse")
    aborted_cls = nested(head, "AbortedTransaction")
    committed = req.isolation_level == READ_COMMITTED
    budget = max(req.max_bytes, 0)
    total = 0
    errors = False
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, hw, start, lso, data = ErrorCode.none, -1, -1, -1, b""
            aborted: list[tuple[int, int]] = []
            try:
                limit = min(p.partition_max_bytes, budget - total)
                if limit > 0 or total == 0:
                    data = await storage.read(
                        t.topic,
                        p.partition,
                        p.fetch_offset,
                        max(limit, 0),
                        must_return_one=total == 0,
                    )
                # after the read: the high watermark answered is never below a record served
                start, hw = storage.offsets(t.topic, p.partition)
                lso = storage.last_stable_offset(t.topic, p.partition)
                if committed:  # aborted ranges taken with (after) the LSO: see _below
                    data = _below(data, lso)
                    aborted = storage.aborted_transactions(
                        t.topic, p.partition, p.fetch_offset, lso
                    )
            except KafkaError as e:
                code, errors = e.code, True
            total += len(data)
            parts.append(
                build(
                    part_cls,
                    partition_index=p.partition,
                    error_code=code,
                    high_watermark=hw,
                    last_stable_offset=lso,
                    log_start_offset=start,
                    aborted_transactions=None
                    if code or not committed
                    else tuple(
                        build(aborted_cls, producer_id=pid, first_offset=first)
                        for pid, first in aborted
                    ),
                    preferred_read_replica=-1,
                    records=data,
                )
            )
        topics.append(build(topic_cls, topic=t.topic, partitions=tuple(parts)))
    response = build(
        resp(head, FETCH),
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(topics),
    )
    return response, total, errors


def _below(data: bytes, lso: int) -> bytes:
    """The batches of `data` that end below the last stable offset. A transaction open when
    the LSO was taken has its records at or above it; one closed by then has its marker
    durable, so its abort (if it aborted) is in the aborted ranges taken after the LSO."""
    end = 0
    for h in iter_headers(data):
        if h.last_offset >= lso:
            break
        end = h.position + h.size
    return data if end == len(data) else data[:end]


@api(LIST_OFFSETS, 1, 8)
async def list_offsets(
    ctx: BrokerContext, head: RequestHead, req: ListOffsetsRequest
) -> ListOffsetsResponse:
    storage = ctx.storage
    part_cls = nested(head, "ListOffsetsPartitionResponse")
    topic_cls = nested(head, "ListOffsetsTopicResponse")
    committed = (
        not isinstance(req, list_offsets_v1.ListOffsetsRequest)
        and req.isolation_level == READ_COMMITTED
    )
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, offset, ts = ErrorCode.none, -1, -1
            try:
                start, end = storage.offsets(t.name, p.partition_index)
                if p.timestamp == -1:  # latest (read_committed: the last stable offset)
                    offset = storage.last_stable_offset(t.name, p.partition_index) if (
                        committed
                    ) else end
                elif p.timestamp in (-2, -4):  # earliest, earliest local
                    offset = start
                elif p.timestamp == -3 or p.timestamp >= 0:  # max timestamp / by time
                    found = await storage.offset_for_time(t.name, p.partition_index, p.timestamp)
                    if found is not None:
                        offset, ts = found
                else:
                    raise KafkaError(ErrorCode.invalid_request, f"timestamp {p.timestamp}")
            except KafkaError as e:
                code = e.code
            parts.append(
                build(
                    part_cls,
                    partition_index=p.partition_index,
                    error_code=code,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=0 if not code else -1,
                )
            )
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    await asyncio.sleep(0)
    return build(resp(head, LIST_OFFSETS), throttle_time=ZERO_MS, topics=tuple(topics))
