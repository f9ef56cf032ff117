"""Fetch (1): long-poll reads of committed data within max_bytes / partition_max_bytes;
with isolation_level read_committed only up to the last stable offset, with the aborted
transactions of the range served (clients drop their records). ListOffsets (2).

KIP-392 (fetch from the closest replica, `broker.replicas`): a partition this broker does not
lead is read from the shared store as a read replica; a partition it leads, asked by a
consumer whose rack_id (Fetch v11+, client.rack) is another live broker's rack, is answered
at once with no records and that broker as preferred_read_replica (Kafka's
RackAwareReplicaSelector; `replica.selector.class` '' turns it off)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Protocol, cast

from kio.schema.list_offsets.v1 import request as list_offsets_v1

from broker.engine import ReplicaRead, StorageEngine
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
from broker.protocol.recordset import EMPTY, RecordSet

READ_COMMITTED = 1
# a fetch that has records ready answers without the partitions whose reads take longer than
# this (from its start): records reach consumers steadily while a cold read fills the cache
SERVE_WITHIN_S = 0.25
# a partition's read in a fetch of many asks for an even share of the fetch's bytes (among
# those with records to read), at least this much: see _Reads
SHARE_FLOOR = 1 << 20
# a partition a little ahead of the others in the log reads this much (one batch) per fetch,
# when at most this many WAL objects ahead: see _Reads._held_back
HELD_BACK_BYTES = 1
HOLD_WITHIN_OBJECTS = 64
# how a partition of a fetch is served (a node id >= 0: sent to that preferred read replica)
LEADER = -1  # this broker leads it (or an error is answered)
REPLICA = -2  # another broker leads it: a read replica's read


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
        # errors and preferred read replicas are answered at once (Kafka's way)
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
    # v11+ carries the consumer's client.rack (KIP-392); like Kafka, only v11+ consumer
    # fetches are served by a replica (older ones of a partition led elsewhere: not leader)
    replicas = hasattr(req, "rack_id") and req.replica_id < 0
    rack = getattr(req, "rack_id", None) or ""
    routes = [_route(storage, t.topic, p.partition, rack, committed, replicas)
              for t in req.topics for p in t.partitions]
    wanted: list[tuple[str, _Wanted]] = [(t.topic, p) for t in req.topics for p in t.partitions]
    reads = _Reads(storage, wanted, budget, routes, committed)
    topics = []
    i = 0
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, hw, start, lso, data = ErrorCode.none, -1, -1, -1, EMPTY
            aborted: list[tuple[int, int]] = []
            route = routes[i]
            try:
                limit = min(p.partition_max_bytes, budget - total)
                got: RecordSet | ReplicaRead = EMPTY
                if route == REPLICA or (route == LEADER and (limit > 0 or total == 0)):
                    got = await reads.result(i, budget - total, total > 0)
                if isinstance(got, ReplicaRead):  # one snapshot: no transactions (see there)
                    data = got.data.within(max(limit, 0), total == 0)
                    start, hw, lso = got.log_start, got.high_watermark, got.high_watermark
                else:
                    data = got.within(max(limit, 0), total == 0)
                    # after the read: the high watermark answered is never below a record
                    start, hw = storage.offsets(t.topic, p.partition)
                    lso = storage.last_stable_offset(t.topic, p.partition)
                    if committed:
                        # the batches ending below the LSO: a transaction open when it was
                        # taken has its records at or above it; one closed by then has its
                        # marker durable, so its abort is in the ranges taken after the LSO
                        data = data.below(lso)
                        aborted = storage.aborted_transactions(
                            t.topic, p.partition, p.fetch_offset, lso
                        )
                if route >= 0:
                    data, aborted, errors = EMPTY, [], True  # no records; answered at once
            except KafkaError as e:
                code, errors = e.code, True
            i += 1
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
                    preferred_read_replica=route if route >= 0 and not code else -1,
                    records=cast(bytes, data),  # written as views: broker/protocol/recordset
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


def _route(
    storage: StorageEngine, topic: str, partition: int, rack: str, committed: bool,
    replicas: bool,
) -> int:
    """LEADER, REPLICA, or the node id of the preferred read replica to send the client to
    (`replicas`: the fetch may be served by a read replica)."""
    try:
        if storage.led_epoch(topic, partition) is None:
            return REPLICA if replicas else LEADER
        if rack:
            return storage.preferred_read_replica(topic, partition, rack, committed)
    except KafkaError:
        pass  # the read answers the error (UNKNOWN_TOPIC_OR_PARTITION)
    return LEADER


class _Wanted(Protocol):
    """A partition of a Fetch request (kio's FetchPartition of any served version)."""

    @property
    def partition(self) -> int: ...
    @property
    def fetch_offset(self) -> int: ...
    @property
    def partition_max_bytes(self) -> int: ...


class _Reads:
    """The partitions' reads of one fetch, started ahead of their turn: while the response is
    put together in order, the reads of the partitions after the current one are already
    under way, as many as the fetch's byte budget could still take (each at most its
    partition_max_bytes), so a fetch of many partitions waits for the object store about
    once, not once per partition. Each read asks for at least one batch; `_within` cuts its
    answer to what the budget left when its turn came, in whole batches. A read whose turn
    never comes (the budget was spent) still finishes: what it fetched is in the cache for the
    next fetch.

    Each read asks for an even share of the budget among the partitions with records past
    their fetch offset (at least SHARE_FLOOR, at most its partition_max_bytes), not for its
    partition_max_bytes in turn: the reads then cover the same stretch of the log, whose WAL
    objects hold every partition's chunks back to back, and make one range GET per object
    between them (s3stream.reader `_join`). Kafka fills the partitions in order instead; a
    consumer asks for "at most", and the fetch's bytes are the same. In 6 s catch-ups of 16
    partitions from moto (benchmarks.catchup): 502-633 range GETs, against 677-729 with each
    read asking for its partition_max_bytes (8 MiB there)."""

    def __init__(
        self,
        storage: StorageEngine,
        parts: list[tuple[str, _Wanted]],
        budget: int,
        routes: list[int] | None = None,  # each partition's LEADER (default) / REPLICA / node
        committed: bool = False,
    ) -> None:
        self.storage, self.parts, self.budget = storage, parts, budget
        self.routes = routes if routes is not None else [LEADER] * len(parts)
        self.committed = committed
        self.tasks: list[asyncio.Future[RecordSet | ReplicaRead]] = []
        self.limits: list[int] = []
        self.ahead = 0  # bytes the started reads not answered (yet) may bring
        self.began = time.monotonic()
        with_records = self._with_records()
        self.share = max(budget // max(len(with_records), 1), SHARE_FLOOR)
        self.held = self._held_back(with_records)

    def _with_records(self) -> list[int]:
        """The partitions this broker leads that have records past the fetch offset."""
        out = []
        for i, ((topic, p), route) in enumerate(zip(self.parts, self.routes, strict=True)):
            if route == LEADER:
                with contextlib.suppress(KafkaError):  # its read answers the error
                    if p.fetch_offset < self.storage.offsets(topic, p.partition)[1]:
                        out.append(i)
        return out

    def _held_back(self, with_records: list[int]) -> set[int]:
        """The partitions whose reads would start in the log (WAL objects) past where the
        read of the furthest-behind one ends: each reads one batch this time
        (HELD_BACK_BYTES), the others their even share as always. A catch-up keeps its
        partitions at the same place in the log, so their reads need the same WAL objects
        and share their GETs; drifted apart (each fetch
        serves the reads done in time, each partition's share spans a different stretch),
        they made a range GET per partition and object. Reads answered from memory (a tailing
        partition's) or from stream objects are never held back, and a held-back partition
        still gets a batch per fetch. Only drift is corrected: a partition more than
        HOLD_WITHIN_OBJECTS WAL objects ahead (a flush makes one; 64 are 0.3 s of writes at a
        low rate, 512 MiB at the most) is elsewhere in the log, not drifted, and reads its
        share: a consumer replaying one topic from last week does not slow its reads of
        another that is minutes behind."""
        at: dict[int, tuple[int, int]] = {}
        for i in with_records:
            topic, p = self.parts[i]
            want = min(p.partition_max_bytes, self.share)
            pos = self.storage.log_position(topic, p.partition, p.fetch_offset, want)
            if pos is not None:
                at[i] = pos
        if len(at) < 2:
            return set()
        reach = min(at.values())[1]  # the last WAL object of the furthest-behind read
        return {i for i, (first, _last) in at.items()
                if reach < first <= reach + HOLD_WITHIN_OBJECTS}

    def _start(self) -> None:
        i = len(self.tasks)
        topic, p = self.parts[i]
        limit = max(min(p.partition_max_bytes, self.budget, self.share), 0)
        if i in self.held:
            limit = min(limit, HELD_BACK_BYTES)
        read: Coroutine[object, object, RecordSet | ReplicaRead]
        if self.routes[i] == REPLICA:
            read = self.storage.replica_read(
                topic, p.partition, p.fetch_offset, limit, self.committed
            )
        elif self.routes[i] == LEADER:
            read = self.storage.read_records(topic, p.partition, p.fetch_offset, limit, True)
        else:  # sent to a preferred read replica: nothing read here
            read, limit = _nothing(), 0
        task = asyncio.ensure_future(read)
        task.add_done_callback(_retrieve)
        self.tasks.append(task)
        self.limits.append(limit)
        self.ahead += limit

    async def result(self, i: int, left: int, have_some: bool) -> RecordSet | ReplicaRead:
        """Partition i's read (its turn has come; the ones after it start while what the reads
        not yet answered may bring stays within `left`, the bytes the budget has left). When
        the read is not done SERVE_WITHIN_S after the fetch's start and the response already
        has records (`have_some`) or a later partition's read has some ready, nothing: the
        read goes on, kept for the next fetch (s3stream.sharedreads), and records reach the
        consumer meanwhile. Its bytes still count against the budget, and a partition whose
        read would go past it is answered without records (and no read): a fetch whose reads
        are slow does not start reads of every partition (in a catch-up of 100 partitions,
        each fetch started 800 MiB of reads to answer 8-16 MiB, and the next one read the
        same offsets again: 14x the bytes served were read)."""
        if len(self.tasks) <= i and self.tasks and self.ahead >= left:
            return EMPTY  # the reads under way may bring all the budget left: none started
        while len(self.tasks) <= i:
            self._start()
        while len(self.tasks) < len(self.parts) and self.ahead < left:
            self._start()
        task = self.tasks[i]
        if not task.done():
            wait = self.began + SERVE_WITHIN_S - time.monotonic()
            if wait > 0:
                await asyncio.wait([task], timeout=wait)
            # past the time: wait on only while no record is ready for this response
            while not task.done() and not have_some and not self._ready_after(i):
                pending = [t for t in self.tasks[i:] if not t.done()]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                return EMPTY  # its bytes stay counted in `ahead`: it is still reading
        self.ahead -= self.limits[i]
        self.limits[i] = 0
        return await task

    def _ready_after(self, i: int) -> bool:
        """Whether a read started for a partition after i has records."""
        return any(
            t.done() and not t.cancelled() and t.exception() is None and _records(t.result())
            for t in self.tasks[i + 1 :]
        )


async def _nothing() -> RecordSet | ReplicaRead:
    return EMPTY


def _records(got: RecordSet | ReplicaRead) -> RecordSet:
    return got.data if isinstance(got, ReplicaRead) else got


def _retrieve(task: asyncio.Future[RecordSet | ReplicaRead]) -> None:
    if not task.cancelled():
        task.exception()  # a read whose turn never came: its error is nobody's


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
