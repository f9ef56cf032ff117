"""Produce (0): validate and append in request order; answer once durable."""

from __future__ import annotations

import asyncio
import datetime

from broker.engine import AppendResult
from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import PRODUCE, ProduceRequest, ProduceResponse
from broker.handlers.base import (
    NO_RESPONSE as NO_RESPONSE,  # net.py's name for what acks=0 answers
)
from broker.handlers.base import (
    ZERO_MS,
    BrokerContext,
    Entity,
    Later,
    Reply,
    api,
    build,
    nested,
    nested_or_none,
    resp,
    when_done,
)
from broker.handlers.txn import coordinator
from broker.protocol.codec import RequestHead
from broker.protocol.records import BatchHeader, CorruptBatchError, read_header
from broker.schemavalidation import InvalidRecords
from broker.txn.markers import is_transactional

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@api(PRODUCE, 3, 11)
async def produce(
    ctx: BrokerContext, head: RequestHead, req: ProduceRequest
) -> Reply[ProduceResponse]:
    storage = ctx.storage
    await storage.room()  # memory: a producer faster than the store waits here for it
    entries: list[tuple[str, int, asyncio.Future[AppendResult] | KafkaError]] = []
    for td in req.topic_data:
        for pd in td.partition_data:
            try:
                if req.acks not in (0, 1, -1):
                    raise KafkaError(ErrorCode.invalid_required_acks, f"acks={req.acks}")
                txn = _transactional(req.transactional_id, pd.records)
                if txn is not None:
                    await coordinator(ctx).verify_write(
                        txn[0], txn[1].producer_id, txn[1].producer_epoch, td.name, pd.index
                    )
                if ctx.schemas is not None and pd.records:
                    # awaited before this partition's append: see broker/schemavalidation.py
                    await ctx.schemas.check(td.name, pd.records, storage.topic(td.name).config)
                entry: asyncio.Future[AppendResult] | KafkaError = storage.append(
                    td.name, pd.index, pd.records
                )
            except KafkaError as e:
                entry = e
            entries.append((td.name, pd.index, entry))
    if req.acks == 0:
        for *_, entry in entries:
            if isinstance(entry, asyncio.Future):
                entry.add_done_callback(lambda f: f.exception())  # retrieved: nobody waits
        return NO_RESPONSE
    timeout = max(req.timeout_ms / 1000, 0.001)
    futures = [e for *_, e in entries if isinstance(e, asyncio.Future)]
    return Later(when_done(futures, timeout, lambda: _response(ctx, head, entries)))


def _transactional(tid: str | None, data: memoryview | None) -> tuple[str, BatchHeader] | None:
    """A transactional batch comes with its transactional id, from the id's current producer
    and epoch (what the caller verifies with the coordinator: returned here), to a partition
    of its open transaction (KIP-890 part 1); clients never send control batches."""
    try:
        h = read_header(data) if data else None
    except CorruptBatchError:
        return None  # the append answers CORRUPT_MESSAGE
    if h is None:
        return None
    if h.is_control:
        raise KafkaError(ErrorCode.invalid_record, "clients may not write control batches")
    if tid is None:
        if is_transactional(h):
            raise KafkaError(ErrorCode.invalid_record, "transactional batch without an id")
        return None
    if not is_transactional(h) or h.producer_id < 0:
        raise KafkaError(ErrorCode.invalid_record, "a transactional produce of a plain batch")
    return tid, h


def _response(
    ctx: BrokerContext,
    head: RequestHead,
    entries: list[tuple[str, int, asyncio.Future[AppendResult] | KafkaError]],
) -> ProduceResponse:
    """The answer once every append is durable or the request's timeout has passed (an
    append not done by then answers REQUEST_TIMED_OUT)."""
    part_cls = nested(head, "PartitionProduceResponse")
    topic_cls = nested(head, "TopicProduceResponse")
    err_cls = nested_or_none(head, "BatchIndexAndErrorMessage")
    by_topic: dict[str, list[Entity]] = {}
    for topic, partition, e in entries:
        base, append_time, code, message = -1, -1, ErrorCode.none, None
        if isinstance(e, KafkaError):
            code, message = e.code, e.message
        elif not e.done():
            code, message = ErrorCode.request_timed_out, "not durable within the request timeout"
            e.add_done_callback(lambda f: f.exception())
        elif isinstance(e.exception(), KafkaError):
            err = e.exception()
            assert isinstance(err, KafkaError)
            code, message = err.code, err.message
        elif e.exception() is not None:
            code, message = ErrorCode.unknown_server_error, repr(e.exception())
        else:
            base, append_time = e.result().base_offset, e.result().log_append_time
        try:
            start = ctx.storage.offsets(topic, partition)[0] if code == ErrorCode.none else -1
        except KafkaError:
            start = -1
        by_topic.setdefault(topic, []).append(
            build(
                part_cls,
                index=partition,
                error_code=code,
                base_offset=base,
                log_append_time=None
                if append_time < 0
                else EPOCH + datetime.timedelta(milliseconds=append_time),
                log_start_offset=start,
                record_errors=tuple(
                    build(err_cls, batch_index=i, batch_index_error_message=m)
                    for i, m in (e.record_errors if isinstance(e, InvalidRecords) else ())
                )
                if err_cls is not None
                else (),
                error_message=message,
            )
        )
    topics = tuple(
        build(topic_cls, name=t, partition_responses=tuple(ps)) for t, ps in by_topic.items()
    )
    return build(resp(head, PRODUCE), responses=topics, throttle_time=ZERO_MS)
