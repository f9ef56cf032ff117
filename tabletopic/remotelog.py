"""One partition of the cluster, read and appended from any broker.

Storage refuses a partition this broker does not lead (NOT_LEADER_OR_FOLLOWER, at once, before
it does anything). `PartitionLog` asks local storage first; when it refuses so, it speaks the
Kafka protocol to the leader (found in `storage.cluster_view()`): ListOffsets for the log's
bounds, Fetch (read_uncommitted, like a local read) to scan it, Produce acks=-1 for one batch.
The small blocking `broker.client.Client` runs in a thread, with a socket timeout and a
deadline per request.

A stale view (the leader moved, is not elected yet, or does not answer at all) is retried
after the next view, for at most `move_wait_s`, by reads; `append` never retries a request
it sent (its outcome may be unknown: the caller decides, see tabletopic/dlq.py).

The peer's bytes are not trusted: a response frame is at most MAX_FRAME bytes and must come
within the deadline, a response that does not decode is NETWORK_EXCEPTION, record batches are
checked (framing, CRC) before they are decoded, and a scan must advance on every round.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from crc32c import crc32c

from broker.client import Client, KafkaClientError, nested
from broker.cluster.model import ClusterView
from broker.engine import AppendResult, StorageEngine
from broker.errors import ErrorCode, KafkaError
from broker.protocol.recordcodec import Record, decode_records
from broker.protocol.records import BatchHeader, CorruptBatchError, read_header

T = TypeVar("T")

FETCH_BYTES = 4 << 20  # per Fetch (a larger first batch is still served whole, KIP-74)
MAX_FRAME = FETCH_BYTES + (8 << 20)  # a response frame above this is refused unread
TIMEOUT_S = 10.0  # connect, and each request's whole response
PRODUCE_TIMEOUT_MS = 5_000  # the broker answers REQUEST_TIMED_OUT before our socket gives up
MOVE_WAIT_S = 10.0  # how long reads follow a moving leader before the error is raised
VIEW_POLL_S = 0.02
# the leader is elsewhere or not known yet: look it up again in the next view
MOVED = frozenset({
    ErrorCode.not_leader_or_follower,
    ErrorCode.leader_not_available,
    ErrorCode.unknown_topic_or_partition,  # the leader has not seen a new topic yet
})


class Unreachable(KafkaError):
    """The leader could not be connected to: nothing was sent (NETWORK_EXCEPTION)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.network_exception, message)


def moved(e: KafkaError) -> bool:
    """Whether asking again after the next cluster view may reach the partition."""
    return e.code in MOVED or isinstance(e, Unreachable)


class PartitionLog:
    """`topic`-`partition` from any broker of the cluster (local calls when this one leads)."""

    def __init__(self, storage: StorageEngine, topic: str, partition: int = 0) -> None:
        self.storage = storage
        self.topic = topic
        self.partition = partition
        self.timeout_s = TIMEOUT_S
        self.move_wait_s = MOVE_WAIT_S
        self.fetch_bytes = FETCH_BYTES

    # -- where the partition is ------------------------------------------------------------
    def leader(self, view: ClusterView) -> str:
        """HOST:PORT of the partition's leader in `view`."""
        lead = view.leaders.get(self.storage.stream_id(self.topic, self.partition))
        where = f"{self.topic}-{self.partition}"
        if lead is None or lead.node_id < 0:
            raise KafkaError(ErrorCode.leader_not_available, f"{where} has no leader yet")
        for b in view.brokers:
            if b.node_id == lead.node_id:
                return f"{b.host}:{b.port}"
        raise KafkaError(ErrorCode.leader_not_available,
                         f"{where}: its leader {lead.node_id} has no address in the view")

    async def next_view(self, seen: object) -> None:
        """Wait (at most move_wait_s) for a cluster view other than `seen`."""
        if seen is None:  # no cluster: nothing will move, only wait a little
            await asyncio.sleep(0.1)
            return
        deadline = time.monotonic() + self.move_wait_s
        while self.storage.cluster_view() is seen and time.monotonic() < deadline:
            await asyncio.sleep(VIEW_POLL_S)

    async def _call(
        self, local: Callable[[], Awaitable[T]], remote: Callable[[str], T], retry: bool
    ) -> T:
        """`await local()`, or, when `local()` refuses at once with NOT_LEADER_OR_FOLLOWER
        (this broker does not lead the partition: nothing was done), `remote(leader)` in a
        thread; if `retry`, all again after each new view while the leader seems to move
        (bounded by move_wait_s)."""
        deadline = time.monotonic() + self.move_wait_s
        while True:
            view = self.storage.cluster_view()
            try:
                try:
                    pending = local()
                except KafkaError as e:
                    if view is None or e.code != ErrorCode.not_leader_or_follower:
                        raise
                else:
                    return await pending
                address = self.leader(view)
                return await asyncio.to_thread(self._remote, remote, address)
            except KafkaError as e:
                if not retry or not moved(e) or time.monotonic() >= deadline:
                    raise
            await self.next_view(view)

    def _remote(self, fn: Callable[[str], T], address: str) -> T:
        """`fn(address)` with every failure of the connection or of the peer's bytes as a
        retriable KafkaError (Unreachable when nothing could be sent)."""
        where = f"{self.topic}-{self.partition} at {address}"
        try:
            return fn(address)
        except KafkaError:
            raise
        except TimeoutError as e:
            raise KafkaError(ErrorCode.request_timed_out, f"{where}: {e}") from None
        except (KafkaClientError, OSError) as e:
            raise KafkaError(ErrorCode.network_exception, f"{where}: {e}") from None
        except Exception as e:  # bytes that do not decode: the peer's fault
            raise KafkaError(ErrorCode.network_exception,
                             f"{where}: malformed response ({type(e).__name__}: {e})") from None

    def _connect(self, address: str) -> Client:
        try:
            return Client(address, timeout=self.timeout_s, client_id="floe-remotelog",
                          max_frame=MAX_FRAME)
        except KafkaClientError as e:
            raise Unreachable(str(e)) from None

    def _error(self, code: int, message: str | None = None) -> KafkaError:
        try:
            known = ErrorCode(code)
        except ValueError:
            known = ErrorCode.unknown_server_error
        where = f"{self.topic}-{self.partition}"
        return KafkaError(known, f"{where}: {known.name}" + (f": {message}" if message else ""))

    # -- log bounds ------------------------------------------------------------------------
    async def offsets(self) -> tuple[int, int]:
        """(log start offset, high watermark)."""

        def local() -> Awaitable[tuple[int, int]]:
            return _now(self.storage.offsets(self.topic, self.partition))

        return await self._call(local, self._remote_offsets, retry=True)

    def _remote_offsets(self, address: str) -> tuple[int, int]:
        part, topic = nested(2, 7, "ListOffsetsPartition"), nested(2, 7, "ListOffsetsTopic")
        out = []
        with self._connect(address) as c:
            for ts in (-2, -1):  # earliest, latest
                r = c.request(2, 7, replica_id=-1, isolation_level=0, topics=(topic(
                    name=self.topic, partitions=(part(partition_index=self.partition,
                                                      current_leader_epoch=-1, timestamp=ts),)),))
                p = self._find(((t.name, q.partition_index), q) for t in r.topics
                               for q in t.partitions)
                if p.error_code:
                    raise self._error(p.error_code)
                out.append(int(p.offset))
        start, end = out
        if not 0 <= start <= end:
            raise self._error(ErrorCode.network_exception, f"log bounds [{start}, {end})")
        return start, end

    def _find(self, entries: Any) -> Any:
        """Our partition's entry of a response (the peer may answer others or none)."""
        for key, entry in entries:
            if key == (self.topic, self.partition):
                return entry
        raise self._error(ErrorCode.network_exception, "the response does not answer it")

    # -- reading ---------------------------------------------------------------------------
    async def read(self, offset: int) -> bytes:
        """Whole record batches from the one holding `offset` (at least one when there is
        any), checked: framing and CRC of each."""

        def local() -> Awaitable[bytes]:
            self.storage.offsets(self.topic, self.partition)  # refuses unless this broker leads
            return self.storage.read(self.topic, self.partition, offset, self.fetch_bytes,
                                     must_return_one=True)

        return await self._call(local, lambda a: self._remote_read(a, offset), retry=True)

    def _remote_read(self, address: str, offset: int) -> bytes:
        fpart, ftopic = nested(1, 12, "FetchPartition"), nested(1, 12, "FetchTopic")
        with self._connect(address) as c:
            r = c.request(
                1, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1,
                max_bytes=self.fetch_bytes, isolation_level=0, session_id=0, session_epoch=-1,
                topics=(ftopic(topic=self.topic, partitions=(fpart(
                    partition=self.partition, current_leader_epoch=-1, fetch_offset=offset,
                    last_fetched_epoch=-1, log_start_offset=-1,
                    partition_max_bytes=self.fetch_bytes),)),),
                forgotten_topics_data=(), rack_id="")
        if r.error_code:
            raise self._error(r.error_code)
        p = self._find(((t.topic, q.partition_index), q) for t in r.responses
                       for q in t.partitions)
        if p.error_code:
            raise self._error(p.error_code)
        return checked_batches(p.records or b"")

    async def scan(self, visit: Callable[[Record], None], start: int, end: int) -> None:
        """Call `visit` with every record in [start, end), once each, in order (a leader
        moving meanwhile: the scan goes on at the new leader where it was)."""
        offset = start
        while offset < end:  # each round advances (or raises): at most end - start rounds
            data = await self.read(offset)
            reached = offset
            try:
                for h in whole_batches(data):
                    for r in decode_records(data, h):
                        if offset <= r.offset < end:
                            visit(r)
                    reached = max(reached, h.next_offset)
            except CorruptBatchError as e:
                raise KafkaError(ErrorCode.corrupt_message,
                                 f"{self.topic}-{self.partition} at {offset}: {e}") from None
            if reached <= offset:
                raise KafkaError(ErrorCode.kafka_storage_error,
                                 f"{self.topic}-{self.partition}: nothing read at {offset} "
                                 f"below the high watermark {end}")
            offset = reached

    # -- appending -------------------------------------------------------------------------
    async def append(self, batch: bytes) -> int:
        """Append one batch (durably: acks=-1); its base offset. Not retried: an error may
        leave the outcome unknown (REQUEST_TIMED_OUT, a connection lost after sending); only
        `Unreachable` and a MOVED code from routing say for sure nothing was written."""

        def local() -> Awaitable[int]:
            pending = self.storage.append(self.topic, self.partition, batch)  # may refuse
            return _base_offset(pending)

        return await self._call(local, lambda a: self._remote_append(a, batch), retry=False)

    def _remote_append(self, address: str, batch: bytes) -> int:
        pdata, tdata = nested(0, 9, "PartitionProduceData"), nested(0, 9, "TopicProduceData")
        with self._connect(address) as c:
            r = c.request(0, 9, transactional_id=None, acks=-1,
                          timeout=datetime.timedelta(milliseconds=PRODUCE_TIMEOUT_MS),
                          topic_data=(tdata(name=self.topic, partition_data=(
                              pdata(index=self.partition, records=batch),)),))
        p = self._find(((t.name, q.index), q) for t in r.responses
                       for q in t.partition_responses)
        if p.error_code:
            raise self._error(p.error_code, p.error_message)
        return int(p.base_offset)


async def _now(value: T) -> T:
    return value


async def _base_offset(pending: Awaitable[AppendResult]) -> int:
    return (await pending).base_offset


def whole_batches(data: bytes) -> list[BatchHeader]:
    """The headers of the whole batches at the start of `data` (a Kafka fetch may end with a
    cut batch: it is left out); CorruptBatchError if there is not even one."""
    out: list[BatchHeader] = []
    pos = 0
    while pos < len(data):
        try:
            h = read_header(data, pos)
        except CorruptBatchError:
            if out:
                break  # the cut last batch
            raise
        out.append(h)
        pos += h.size
    return out


def checked_batches(data: bytes) -> bytes:
    """The whole batches of a fetched `data`, each with its CRC checked (KafkaError
    CORRUPT_MESSAGE, retriable, otherwise)."""
    try:
        headers = whole_batches(data)
    except CorruptBatchError as e:
        raise KafkaError(ErrorCode.corrupt_message, f"fetched records: {e}") from None
    view = memoryview(data)
    for h in headers:
        if crc32c(view[h.position + 21 : h.position + h.size]) != h.crc:
            raise KafkaError(ErrorCode.corrupt_message, f"CRC mismatch at byte {h.position}")
    return data[: headers[-1].position + headers[-1].size] if headers else b""
