"""Dead letters written from a broker that does not lead the DLQ partition (issue 13).

Broker A (node 1) is a real `floe broker` process; broker B (node 2) is a Storage engine in
this process sharing A's SQLite metadata file and object directory. B never announces an
address, so it leads nothing: the DLQ topic it creates is led by A, and its DeadLetters reach
A over the Kafka protocol (Fetch to read back, Produce acks=-1 to append). Then C (node 3)
starts and A stops: B's next write follows the leader to C. A stub cluster view pointing at
hostile servers on 127.0.0.1 gives clear retriable errors within the timeouts, never a hang.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import KafkaError as ClientError
from crc32c import crc32c
from kio.index import load_response_schema
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer

from broker.client import nested
from broker.cluster import BrokerInfo, ClusterSettings, ClusterView, Leader
from broker.errors import ErrorCode, KafkaError
from broker.protocol.recordcodec import Record, encode_batch
from broker.storage import Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import open_object_store
from tabletopic.convert import Invalid
from tabletopic.dlq import DeadLetters
from tests.brokerproc import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SOURCE = "clicks"
DLQ = "clicks.dlq"
TIMEOUT_S = 30.0


def dead(offsets: range, partition: int) -> list[Invalid]:
    return [Invalid(Record(o, 1_700_000_000_000 + o, f"k{partition}-{o}".encode(),
                           f"bad {partition}-{o}".encode(), (("h", b"v"),)),
                    f"not JSON at {o}") for o in offsets]


@dataclass
class Cluster:
    tmp: Path
    procs: dict[int, BrokerProcess] = field(default_factory=dict)

    def args(self, node: int) -> list[str]:
        return ["--node-id", str(node), "--object-store", (self.tmp / "objects").as_uri(),
                "--metadata", f"sqlite:///{self.tmp / 'meta.db'}"]

    def start(self, node: int) -> BrokerProcess:
        b = BrokerProcess(self.tmp / f"b{node}", self.args(node))
        self.procs[node] = b.start()
        return b


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Cluster, Storage]]:
    c = Cluster(tmp_path)
    storage: Storage | None = None
    try:
        c.start(1)
        storage = Storage(open_object_store((tmp_path / "objects").as_uri()),
                          SqliteMetadataStore(tmp_path / "meta.db"),
                          WalSettings(flush_interval_ms=1), ClusterSettings(node_id=2))
        await storage.open()
        yield c, storage
    finally:
        if storage is not None:
            await storage.close()
        for b in c.procs.values():
            b.stop()


Letter = tuple[int, bytes | None, bytes | None, dict[str, Any]]


def read_back(bootstrap: str) -> list[Letter]:
    """(offset, key, value, headers) of every record of the DLQ, read by librdkafka."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-check",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    out: list[Letter] = []
    try:
        c.assign([TopicPartition(DLQ, 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                assert err.code() == ClientError._PARTITION_EOF, err
                return out
            out.append((int(m.offset() or 0), m.key(), m.value(), dict(m.headers() or [])))
        raise AssertionError("did not reach the end of the DLQ")
    finally:
        c.close()


def leader_of(storage: Storage) -> int:
    view = storage.cluster_view()
    assert view is not None
    lead = view.leaders.get(storage.stream_id(DLQ, 0))
    return -1 if lead is None else lead.node_id


def serves(storage: Storage) -> bool:
    try:
        storage.offsets(DLQ, 0)
    except KafkaError:
        return False
    return True


async def until(what: str, check: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_dead_letters_from_a_broker_that_does_not_lead_the_dlq(
    cluster: tuple[Cluster, Storage],
) -> None:
    c, b = cluster
    a = c.procs[1]
    dlq = DeadLetters(b, DLQ, SOURCE)
    await dlq.load()  # no DLQ topic yet: nothing to read
    assert dlq.count == 0
    assert await dlq.write(0, dead(range(3), 0)) == 3  # creates the topic, led by A
    assert leader_of(b) == 1
    with pytest.raises(KafkaError):
        b.offsets(DLQ, 0)  # B does not lead it
    assert await dlq.write(1, dead(range(10, 12), 1)) == 2
    assert await dlq.write(0, dead(range(5), 0)) == 2  # 0-2 are in already
    assert dlq.count == 7 and dlq.written == {0: 4, 1: 11}

    got = await asyncio.to_thread(read_back, a.bootstrap)
    assert [o for o, *_ in got] == list(range(7))
    want = [(0, o) for o in range(3)] + [(1, 10), (1, 11)] + [(0, 3), (0, 4)]
    for (_, key, value, hs), (p, o) in zip(got, want, strict=True):
        assert key == f"k{p}-{o}".encode() and value == f"bad {p}-{o}".encode()
        assert hs["floe.source.topic"] == SOURCE.encode()
        assert hs["floe.source.partition"] == str(p).encode()
        assert hs["floe.source.offset"] == str(o).encode()
        assert hs["floe.error.reason"] == f"not JSON at {o}".encode()
        assert hs["h"] == b"v"

    # as after a restart: a fresh DeadLetters on B reads the DLQ back from A, adds nothing
    again = DeadLetters(b, DLQ, SOURCE)
    await again.load()
    assert again.count == 7 and again.written == {0: 4, 1: 11}
    assert await again.write(0, dead(range(5), 0)) == 0
    assert await again.write(1, dead(range(10, 12), 1)) == 0
    assert len(await asyncio.to_thread(read_back, a.bootstrap)) == 7

    # the leader moves: C starts, A stops gracefully (its partitions are handed over); B's
    # view may still name A when it writes next
    cproc = c.start(3)
    # the DLQ goes to C, pinned (what AlterPartitionReassignments does): B, should it take
    # the controller role when A leaves, would place it anywhere (itself included)
    assert await b.reassign_partitions([(DLQ, 0, 3)]) == [None]
    a.stop()
    stale = leader_of(b)  # usually still 1: the write finds A gone, then C
    began = time.monotonic()
    assert await again.write(1, dead(range(10, 14), 1)) == 2
    print(f"\nA stopped; B's view named leader {stale}; B's write reached C in"
          f" {time.monotonic() - began:.2f} s")
    await until("B's view names C", lambda: leader_of(b) == 3)
    assert await again.write(0, dead(range(5), 0)) == 0  # still nothing twice
    got = await asyncio.to_thread(read_back, cproc.bootstrap)
    assert [(hs["floe.source.partition"], hs["floe.source.offset"]) for *_, hs in got] == [
        (str(p).encode(), str(o).encode()) for p, o in [*want, (1, 12), (1, 13)]]

    # a write whose outcome B cannot know (the connection drops after the batch is sent):
    # the DLQ is read (from where B had read it to) before the next write: never twice
    real = again.log._remote_append

    def lost(address: str, batch: bytes) -> int:
        real(address, batch)
        raise KafkaError(ErrorCode.network_exception, "connection lost before the answer")

    with patch.object(again.log, "_remote_append", lost), pytest.raises(KafkaError) as e:
        await again.write(0, dead(range(7), 0))
    assert e.value.code == ErrorCode.network_exception
    assert await again.write(0, dead(range(7), 0)) == 0  # 5 and 6 are in: the lost write
    assert again.count == 11
    got = await asyncio.to_thread(read_back, cproc.bootstrap)
    assert len(got) == 11

    # another writer (another broker's worker, or one that led source partition 1 while
    # this one did not) appends meanwhile: read before writing, nothing twice
    other = DeadLetters(b, DLQ, SOURCE)
    assert await other.write(1, dead(range(10, 16), 1)) == 2  # 14, 15
    assert await again.write(1, dead(range(10, 17), 1)) == 1  # only 16
    assert again.count == 14 and again.written == {0: 6, 1: 16}
    assert await other.write(1, dead(range(10, 17), 1)) == 0
    got = await asyncio.to_thread(read_back, cproc.bootstrap)
    assert [hs["floe.source.offset"] for *_, hs in got[-3:]] == [b"14", b"15", b"16"]

    # the DLQ's leader becomes B itself (it announces an address, C stops): local calls again
    await b.advertise("127.0.0.1", 1)
    cproc.stop()
    await until("B to lead the DLQ", lambda: leader_of(b) == 2 and serves(b))
    assert await again.write(2, dead(range(1), 2)) == 1
    assert b.offsets(DLQ, 0) == (0, 15)
    last = DeadLetters(b, DLQ, SOURCE)
    await last.load()
    assert last.count == 15 and last.written == {0: 6, 1: 16, 2: 0}


# -- hostile or closed connections -------------------------------------------------------
class StubStorage:
    """Just what DeadLetters asks of storage: the DLQ exists, node 7 at `address` leads it,
    this broker refuses it."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.topics: dict[str, Any] = {DLQ: object()}
        self.view = ClusterView((BrokerInfo(7, host, int(port), None),), 7, {42: Leader(7, 1)})

    def cluster_view(self) -> ClusterView:
        return self.view

    def stream_id(self, topic: str, partition: int) -> int:
        return 42

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        raise KafkaError(ErrorCode.not_leader_or_follower, "not here")

    def append(self, topic: str, partition: int, data: bytes | None) -> Any:
        raise KafkaError(ErrorCode.not_leader_or_follower, "not here")


@contextmanager
def server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that handles each connection with `answer`."""
    ls = socket.create_server(("127.0.0.1", 0))
    ls.settimeout(0.2)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = ls.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)
            with suppress(OSError):
                answer(conn)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{ls.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        ls.close()
        for conn in conns:
            conn.close()


def close_at_once(conn: socket.socket) -> None:
    conn.close()


def huge_frame(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.sendall(struct.pack(">i", 2**31 - 1) + b"\0" * 64)


def garbage(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.sendall(struct.pack(">i", 12) + b"\xff" * 12)


def silent(conn: socket.socket) -> None:
    conn.recv(65536)  # then nothing: the client's deadline must end it


def trickle(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.sendall(struct.pack(">i", 1000))
    for _ in range(30):  # a byte every 0.1 s: each recv returns, the whole never comes
        conn.sendall(b"\0")
        time.sleep(0.1)


@pytest.mark.parametrize(("answer", "code"), [
    (close_at_once, ErrorCode.network_exception),
    (huge_frame, ErrorCode.network_exception),
    (garbage, ErrorCode.network_exception),
    (silent, ErrorCode.request_timed_out),
    (trickle, ErrorCode.request_timed_out),
])
async def test_a_hostile_or_closed_leader_gives_a_retriable_error_soon(
    answer: Callable[[socket.socket], None], code: ErrorCode
) -> None:
    with server(answer) as address:
        dlq = DeadLetters(StubStorage(address), DLQ, SOURCE)  # type: ignore[arg-type]
        dlq.log.timeout_s = 1.0
        dlq.log.move_wait_s = 1.0
        began = time.monotonic()
        with pytest.raises(KafkaError) as e:
            await dlq.write(0, dead(range(2), 0))
        assert e.value.code == code and e.value.code.retriable, e.value
        assert address in str(e.value)
        assert time.monotonic() - began < 5.0
        assert dlq.written is None  # nothing known: read again before any write


async def test_an_unreachable_leader_is_looked_up_again_then_reported() -> None:
    s = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nobody listens there: connections are refused
    dlq = DeadLetters(StubStorage(address), DLQ, SOURCE)  # type: ignore[arg-type]
    dlq.log.move_wait_s = 0.5
    began = time.monotonic()
    with pytest.raises(KafkaError) as e:
        await dlq.write(0, dead(range(2), 0))
    assert e.value.code == ErrorCode.network_exception and "cannot connect" in str(e.value)
    assert time.monotonic() - began < 5.0


# -- a leader that answers in good protocol but serves hostile record bytes ----------------
def fake_leader(records: bytes, start: int, end: int) -> Callable[[socket.socket], None]:
    """ListOffsets: [start, end) (earliest, then latest); every Fetch: `records`."""
    asked = [0]

    def answer(conn: socket.socket) -> None:
        conn.settimeout(5)
        for _ in range(4):  # a few requests per connection at most
            head = conn.recv(4)
            if len(head) < 4:
                return
            (n,) = struct.unpack(">i", head)
            frame = b""
            while len(frame) < n:
                frame += conn.recv(n - len(frame))
            req, _ = entity_reader(RequestHeader)(frame, 0)
            key, version = int(req.request_api_key), int(req.request_api_version)
            cls: Any = load_response_schema(key, version)
            zero = datetime.timedelta(0)
            if key == 2:  # ListOffsets
                part = nested(key, version, "ListOffsetsPartitionResponse", request=False)
                topic = nested(key, version, "ListOffsetsTopicResponse", request=False)
                offset = end if asked[0] % 2 else start  # asked earliest, then latest
                asked[0] += 1
                resp: Any = cls(throttle_time=zero, topics=(topic(name=DLQ, partitions=(
                    part(partition_index=0, error_code=ErrorCode.none, offset=offset),)),))
            else:  # Fetch
                part = nested(key, version, "PartitionData", request=False)
                topic = nested(key, version, "FetchableTopicResponse", request=False)
                resp = cls(throttle_time=zero, error_code=ErrorCode.none, responses=(
                    topic(topic=DLQ, partitions=(part(
                        partition_index=0, error_code=ErrorCode.none, high_watermark=end,
                        aborted_transactions=None, records=records),)),))
            buf = io.BytesIO()
            entity_writer(cls.__header_schema__)(
                buf, cls.__header_schema__(correlation_id=req.correlation_id))
            entity_writer(cls)(buf, resp)
            body = buf.getvalue()
            conn.sendall(struct.pack(">i", len(body)) + body)

    return answer


def with_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def letter_batch() -> bytearray:
    return bytearray(encode_batch([(b"k", b"v", [("floe.source.topic", SOURCE.encode())])]))


def bad_crc() -> bytes:
    b = letter_batch()
    b[-1] ^= 0xFF
    return bytes(b)


def negative_header_key() -> bytes:
    """A header count of 2**62 whose key length is -1: without a bound, a loop of 2**62."""
    b = letter_batch()
    i = b.index(b"\x22floe.source.topic")  # the varint 17 (zigzag 34 = 0x22), then the key
    count_at = i - 1
    assert b[count_at] == 2  # zigzag(1)
    b[count_at:i + 1 + 17] = bytes([0x80] * 8 + [0x7F]) + b"\x01"  # count 2**62, key len -1
    struct.pack_into(">i", b, 8, len(b) - 12)
    return with_crc(b)


def no_progress() -> bytes:
    """A batch whose offsets are below the one asked for: the scan cannot advance."""
    return bytes(letter_batch())  # base offset 0, while the scan asks for 3


@pytest.mark.parametrize(("records", "start", "code", "says"), [
    (bad_crc(), 0, ErrorCode.corrupt_message, "CRC mismatch"),
    (negative_header_key(), 0, ErrorCode.corrupt_message, "negative header key length"),
    (b"\x00" * 30, 0, ErrorCode.corrupt_message, "truncated batch header"),
    (no_progress(), 3, ErrorCode.kafka_storage_error, "nothing read at 3"),
])
async def test_hostile_record_bytes_give_a_retriable_error(
    records: bytes, start: int, code: ErrorCode, says: str
) -> None:
    with server(fake_leader(records, start, 5)) as address:
        dlq = DeadLetters(StubStorage(address), DLQ, SOURCE)  # type: ignore[arg-type]
        dlq.log.timeout_s = 1.0
        dlq.log.move_wait_s = 1.0
        began = time.monotonic()
        with pytest.raises(KafkaError) as e:
            await dlq.load()
        assert e.value.code == code and e.value.code.retriable, e.value
        assert says in str(e.value)
        assert time.monotonic() - began < 5.0
        assert dlq.written is None
