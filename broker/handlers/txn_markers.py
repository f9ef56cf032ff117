"""WriteTxnMarkers (27): the inter-broker request by which a transaction coordinator has a
partition's leader write a transaction's COMMIT or ABORT marker (broker.txn.remote sends it).

Each partition is answered on its own: its marker is appended through the log's durable path
(as the coordinator's own markers are) and answered once durable; a partition this broker
does not lead is NOT_LEADER_OR_FOLLOWER (the coordinator asks its leader after the next
view); a marker whose producer epoch is older than the one the partition has seen from that
producer is INVALID_PRODUCER_EPOCH (a stale coordinator, as Kafka answers); one whose
coordinator epoch is below that of a marker written there for the producer is
TRANSACTION_COORDINATOR_FENCED (its coordinator lost the id: broker.txn.index). The partitions of
`__consumer_offsets` stand for the groups of a coordinator slot: the group coordinator learns
that the transaction's offsets committed (broker.txn.coordinator.group_marker).
"""

from __future__ import annotations

import asyncio

from broker.engine import AppendResult
from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import (
    WRITE_TXN_MARKERS,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from broker.handlers.base import BrokerContext, api, build, nested, resp
from broker.handlers.txn import coordinator
from broker.producers import ProducerStates
from broker.protocol.codec import RequestHead
from broker.txn.remote import GROUP_MARKER_TOPIC

MARKER_WAIT_S = 8.0  # below the sender's deadline (broker.txn.remote.TIMEOUT_S)


def _stale_epoch(ctx: BrokerContext, topic: str, partition: int, pid: int, epoch: int) -> bool:
    producers = getattr(ctx.storage, "producers", None)
    if not isinstance(producers, ProducerStates):
        return False
    entry = producers.pending.get(ctx.storage.stream_id(topic, partition), {}).get(pid)
    return entry is not None and epoch < entry.epoch


@api(WRITE_TXN_MARKERS, 1, 2)
async def write_txn_markers(
    ctx: BrokerContext, head: RequestHead, req: WriteTxnMarkersRequest
) -> WriteTxnMarkersResponse:
    results: list[dict[tuple[str, int], ErrorCode | asyncio.Future[AppendResult]]] = []
    pids: list[int] = []
    for m in req.markers:
        pids.append(m.producer_id)
        out: dict[tuple[str, int], ErrorCode | asyncio.Future[AppendResult]] = {}
        for t in m.topics:
            for p in t.partition_indexes:
                try:
                    if t.name == GROUP_MARKER_TOPIC:
                        await coordinator(ctx).group_marker(
                            m.producer_id, m.transaction_result, p)
                        out[(t.name, p)] = ErrorCode.none
                        continue
                    if _stale_epoch(ctx, t.name, p, m.producer_id, m.producer_epoch):
                        raise KafkaError(ErrorCode.invalid_producer_epoch)
                    out[(t.name, p)] = ctx.storage.append_marker(
                        t.name, p, m.producer_id, m.producer_epoch, m.transaction_result,
                        m.coordinator_epoch)
                except KafkaError as e:
                    out[(t.name, p)] = e.code
        results.append(out)
    futures = [f for out in results for f in out.values() if isinstance(f, asyncio.Future)]
    if futures:
        await asyncio.wait(futures, timeout=MARKER_WAIT_S)
    marker_cls = nested(head, "WritableTxnMarkerResult")
    topic_cls = nested(head, "WritableTxnMarkerTopicResult")
    part_cls = nested(head, "WritableTxnMarkerPartitionResult")
    answers = []
    for pid, out in zip(pids, results, strict=True):
        by_topic: dict[str, list[object]] = {}
        for (topic, partition), entry in out.items():
            code = _code(entry)
            if code == ErrorCode.none and topic != GROUP_MARKER_TOPIC and ctx.txn is not None:
                ctx.txn.marker_written(pid, topic, partition)
            by_topic.setdefault(topic, []).append(
                build(part_cls, partition_index=partition, error_code=code))
        answers.append(build(marker_cls, producer_id=pid, topics=tuple(
            build(topic_cls, name=t, partitions=tuple(ps)) for t, ps in by_topic.items())))
    return build(resp(head, WRITE_TXN_MARKERS), markers=tuple(answers))


def _code(entry: ErrorCode | asyncio.Future[AppendResult]) -> ErrorCode:
    if isinstance(entry, ErrorCode):
        return entry
    if not entry.done():
        entry.add_done_callback(lambda f: f.exception())  # retrieved: nobody waits
        return ErrorCode.request_timed_out
    exc = entry.exception()
    if exc is None:
        return ErrorCode.none
    return exc.code if isinstance(exc, KafkaError) else ErrorCode.kafka_storage_error
