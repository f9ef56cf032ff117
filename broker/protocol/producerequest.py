"""Produce requests (v3-v11) read straight off their frame: record sets are not copied.

kio's reader (with the bounded walk of framecheck.py before it) copies every partition's
record set into a bytes object, and the log then copied it again to write the offsets in: two
copies of every produced byte, and the walk, on the broker's busiest path (issue 17). Here a
record set is a memoryview into the frame, writable when the frame is (the network layer
hands a bytearray it owns), so the log writes the batches' base offsets in place and the WAL
takes the bytes from there (broker/storage.py `append`, s3stream/wal.py `_upload`).

The layout (Kafka's ProduceRequest.json; v9+ are flexible: compact lengths, tagged fields):

    transactional_id  nullable string          acks  int16          timeout_ms  int32
    topic_data        array of: name  string
                                partition_data  array of: index  int32
                                                          records  nullable bytes (RECORDS)
                                                          [tagged fields]
                                [tagged fields]
    [tagged fields]

Bytes from the network are hostile: every length and count is checked against the bytes left
before anything is sliced or looped over (an array counts at least its elements' smallest
size), varints are at most 5 bytes, a null where the schema has none (topic name, arrays) is
refused, names must be UTF-8. Tagged fields are skipped (Produce defines none up to v11), and
bytes after the body are ignored, as in kio's path (codec.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.protocol.framecheck import MalformedFrame, read_uvarint
from broker.protocol.heads import ProtocolError, RequestHead

PRODUCE_KEY = 0
PRODUCE_VERSIONS = (3, 11)  # what this reader knows: v12 changes nothing, v13 names topics by id
FIRST_FLEXIBLE = 9
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_ACKS_TIMEOUT = struct.Struct(">hi")


@dataclass(slots=True)
class PartitionData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class TopicData:
    name: str
    partition_data: list[PartitionData]


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicData]


class _Reader:
    """A position in a frame; every read checks the bytes left."""

    __slots__ = ("end", "pos", "view")

    def __init__(self, view: memoryview, pos: int) -> None:
        self.view = view
        self.pos = pos
        self.end = len(view)

    def take(self, n: int) -> int:
        """Skip n bytes; the position they start at."""
        at = self.pos
        if n < 0 or at + n > self.end:
            raise MalformedFrame(f"{n} bytes at {at} run past the end ({self.end})")
        self.pos = at + n
        return at

    def i16(self) -> int:
        value: int = _I16.unpack_from(self.view, self.take(2))[0]
        return value

    def i32(self) -> int:
        value: int = _I32.unpack_from(self.view, self.take(4))[0]
        return value

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.view, self.pos, self.end)
        return value

    def length(self, compact: bool, legacy: int) -> int:
        """A string's or bytes' length, -1 for null: compact (varint n+1) or legacy."""
        n = self.uvarint() - 1 if compact else legacy
        if n < -1:
            raise MalformedFrame(f"length {n} at {self.pos}")
        return n

    def string(self, n: int, what: str) -> str:
        at = self.take(n)
        try:
            return str(self.view[at : at + n], "utf-8")
        except UnicodeDecodeError as e:
            raise MalformedFrame(f"{what} is not UTF-8: {e}") from None

    def count(self, compact: bool, smallest: int, what: str) -> int:
        """An array's element count, bounded by the bytes left (each takes `smallest`)."""
        n = self.uvarint() - 1 if compact else self.i32()
        if n < 0:
            raise MalformedFrame(f"null or negative {what} array ({n})")
        if n * smallest > self.end - self.pos:
            raise MalformedFrame(f"{n} {what} cannot fit in {self.end - self.pos} bytes")
        return n

    def skip_tags(self) -> None:
        n = self.uvarint()  # the count itself, not n + 1; each field: tag, size, bytes
        if 2 * n > self.end - self.pos:
            raise MalformedFrame(f"{n} tagged fields cannot fit in {self.end - self.pos} bytes")
        for _ in range(n):
            self.uvarint()  # the tag: none is known in Produce up to v11
            self.take(self.uvarint())


def decode_produce(
    frame: bytes | bytearray | memoryview, version: int, correlation_id: int, client_host: str
) -> tuple[RequestHead, ProduceRequest]:
    """The head and body of a Produce request frame (without its size prefix) of `version`
    (which the caller, codec.decode_request, has peeked and checked is served); its record
    sets are views into `frame`. ProtocolError when it is malformed."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    r = _Reader(view, 0)
    try:
        client_len = _HEAD.unpack_from(view, r.take(10))[3]
        client_id = None if client_len == -1 else r.string(r.length(False, client_len), "client id")
        flexible = version >= FIRST_FLEXIBLE
        if flexible:
            r.skip_tags()  # request header v2
        n = r.length(flexible, 0 if flexible else r.i16())
        transactional_id = None if n == -1 else r.string(n, "transactional id")
        acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(view, r.take(6))
        topics = []
        # smallest topic: a name (1 or 2 bytes) and an empty array (1 or 4); partition: an
        # index and a null record set (4 + 1 or 4 + 4), a tagged-field count when flexible
        for _ in range(r.count(flexible, 3 if flexible else 6, "topic")):
            n = r.length(flexible, 0 if flexible else r.i16())
            if n == -1:
                raise MalformedFrame("null topic name")
            name = r.string(n, "topic name")
            parts = []
            for _ in range(r.count(flexible, 6 if flexible else 8, "partition")):
                index = r.i32()
                n = r.length(flexible, 0 if flexible else r.i32())
                at = r.take(max(n, 0))
                parts.append(PartitionData(index, None if n == -1 else view[at : at + n]))
                if flexible:
                    r.skip_tags()
            if flexible:
                r.skip_tags()
            topics.append(TopicData(name, parts))
        if flexible:
            r.skip_tags()
    except (MalformedFrame, struct.error) as e:
        raise ProtocolError(f"malformed api 0 v{version} request: {e}") from e
    head = RequestHead(PRODUCE_KEY, version, correlation_id, client_id, client_host)
    return head, ProduceRequest(transactional_id, acks, timeout_ms, topics)
