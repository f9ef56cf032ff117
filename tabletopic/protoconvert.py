"""Protobuf writer schemas for tabletopic.schemaconvert: the registered schema (a base64
FileDescriptorProto or .proto text) is parsed and built into a descriptor pool by the Schema
Registry's own code (broker.schemaregistry.protobuf.descriptor_pool_of, with its references and
the well-known types it imports); values are parsed with protobuf's dynamic message classes
and walked by their descriptors into rows.

Which message: by_schema_id values carry Confluent's message indexes after the schema id
(zigzag varints: a count, then the index of a top-level message and of nested ones; a single
0 byte means the first message); by_latest_schema values are the bare message, of the file's
first message type, or the one `table.topic.convert.value.message.full.name` (keys:
`.key.message.full.name`) names. Each message type is its own writer type (its own column
set, merged like any other).

Protobuf -> Arrow (-> Iceberg): int32, sint32, sfixed32 -> int32 (int); int64, sint64,
sfixed64, uint32, fixed32 -> int64 (long); uint64, fixed64 -> int64 (a value above 2^63 - 1
makes the record invalid); float, double, bool, string; bytes -> binary; enum -> string (the
value's name, its number if unnamed); message -> struct; repeated -> list; map<K, V> -> map;
google.protobuf.Timestamp -> timestamp[us, UTC] (timestamptz); the wrappers
(google.protobuf.StringValue, Int64Value, ...) -> their value, nullable; google.type.Date ->
date32; google.protobuf.Struct / Value / ListValue -> their JSON text (string). A field with
presence (a message, `optional`, a oneof member, proto2) that is not set is null; a proto3
scalar without presence has its default value. A recursive message has no Iceberg form
(Conflict).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor, json_format, message_factory
from google.protobuf.message import Message

from broker.schemaregistry.protobuf import descriptor_pool_of
from tabletopic.convert import INT64_MAX, Conflict
from tabletopic.typeconvert import Shape

FD = descriptor.FieldDescriptor
Get = Callable[[Any], Any]
Node = tuple[pa.DataType, Get]
MAX_DEPTH = 64
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _unsigned64(v: int) -> int:
    if v > INT64_MAX:
        raise Conflict(f"unsigned value {v} does not fit a long")
    return v


def _identity(v: Any) -> Any:
    return v


SCALARS: dict[int, Node] = {
    **{t: (pa.int32(), _identity) for t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32)},
    **{t: (pa.int64(), _identity) for t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64,
                                            FD.TYPE_UINT32, FD.TYPE_FIXED32)},
    FD.TYPE_UINT64: (pa.int64(), _unsigned64),
    FD.TYPE_FIXED64: (pa.int64(), _unsigned64),
    FD.TYPE_FLOAT: (pa.float32(), _identity),
    FD.TYPE_DOUBLE: (pa.float64(), _identity),
    FD.TYPE_BOOL: (pa.bool_(), _identity),
    FD.TYPE_STRING: (pa.string(), _identity),
    FD.TYPE_BYTES: (pa.binary(), bytes),
}
WRAPPERS = {f"google.protobuf.{n}Value" for n in (
    "Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}
JSON_TYPES = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


def _timestamp(m: Any) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=m.seconds, microseconds=m.nanos // 1000)


def _date(m: Any) -> dt.date:
    return dt.date(m.year, m.month, m.day)


def _json(m: Message) -> str:
    return json.dumps(json_format.MessageToDict(m), separators=(",", ":"))


class _Compiler:
    def __init__(self) -> None:
        self.open: set[str] = set()  # messages being compiled: seeing one again is recursion

    def message(self, d: descriptor.Descriptor, depth: int = 0) -> Node:
        if d.full_name == "google.protobuf.Timestamp":
            return pa.timestamp("us", tz="UTC"), _timestamp
        if d.full_name == "google.type.Date":
            return pa.date32(), _date
        if d.full_name in JSON_TYPES:
            return pa.string(), _json
        if d.full_name in WRAPPERS:
            t, get = self.scalar(d.fields_by_name["value"])
            return t, lambda m: get(m.value)
        if d.full_name in self.open or depth > MAX_DEPTH:
            raise Conflict(f"message {d.full_name} is recursive: it has no Iceberg form")
        self.open.add(d.full_name)
        fields = [(f.name, self.field(f, depth)) for f in d.fields]
        self.open.discard(d.full_name)

        def struct(m: Any) -> dict[str, Any]:
            return {name: get(m) for name, (_t, get) in fields}

        return pa.struct([pa.field(n, t) for n, (t, _g) in fields]), struct

    def scalar(self, f: descriptor.FieldDescriptor, depth: int = 0) -> Node:
        """The type of one element of the field and how to convert an element."""
        if f.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
            assert f.message_type is not None
            return self.message(f.message_type, depth + 1)
        if f.type == FD.TYPE_ENUM:
            assert f.enum_type is not None
            names = {v.number: v.name for v in f.enum_type.values}
            return pa.string(), lambda v: names.get(v, str(v))
        return SCALARS[f.type]

    def field(self, f: descriptor.FieldDescriptor, depth: int) -> Node:
        name, entry = f.name, f.message_type
        if f.type == FD.TYPE_MESSAGE and entry is not None and entry.GetOptions().map_entry:
            kt, kget = self.scalar(entry.fields_by_name["key"], depth)
            vt, vget = self.scalar(entry.fields_by_name["value"], depth)
            return pa.map_(kt, vt), lambda m: [(kget(k), vget(v))
                                               for k, v in getattr(m, name).items()]
        et, eget = self.scalar(f, depth)
        if f.is_repeated:
            return pa.list_(et), lambda m: [eget(v) for v in getattr(m, name)]
        if f.has_presence:
            return et, lambda m: eget(getattr(m, name)) if m.HasField(name) else None
        return et, lambda m: eget(getattr(m, name))


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at pos, and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise Conflict("truncated message indexes")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos


def message_indexes(payload: bytes) -> tuple[tuple[int, ...], int]:
    """Confluent's message indexes at the start of payload, and where the message starts."""
    count, pos = _varint(payload, 0)
    if count == 0:
        return (0,), pos
    if not 0 < count <= 100:
        raise Conflict(f"{count} message indexes")
    out = []
    for _ in range(count):
        i, pos = _varint(payload, pos)
        out.append(i)
    return tuple(out), pos


class ProtoWriter:
    """One Protobuf writer schema: a file with one or more message types."""

    def __init__(self, text: str, deps: list[tuple[str, str]]) -> None:
        fdp, pool = descriptor_pool_of(text, deps)
        self.file = pool.FindFileByName(fdp.name)
        if not self.file.message_types_by_name:
            raise Conflict("the schema has no message type")
        self.shapes: dict[tuple[int, ...] | str, Shape] = {}

    def _named(self, name: str) -> descriptor.Descriptor:
        """A message type of this file by its full name (`package.Outer.Inner`)."""
        todo = list(self.file.message_types_by_name.values())
        while todo:
            d = todo.pop()
            if d.full_name == name:
                return d
            todo += list(d.nested_types)
        raise Conflict(f"the schema has no message {name[:200]!r}")

    def _message(self, indexes: tuple[int, ...]) -> descriptor.Descriptor:
        types = list(self.file.message_types_by_name.values())
        d: descriptor.Descriptor | None = None
        for i in indexes:
            if not 0 <= i < len(types):
                raise Conflict(f"message indexes {list(indexes)} name no message")
            d = types[i]
            types = list(d.nested_types)
        assert d is not None
        return d

    def select(self, payload: bytes, framed: bool, message: str = ""
               ) -> tuple[Hashable, Shape, bytes]:
        indexes: tuple[int, ...] | str
        indexes, start = message_indexes(payload) if framed else (message or (0,), 0)
        shape = self.shapes.get(indexes)
        if shape is None:
            d = self._message(indexes) if isinstance(indexes, tuple) else self._named(indexes)
            top, get = _Compiler().message(d)
            cls = message_factory.GetMessageClass(d)

            def decode(body: bytes) -> dict[str, Any]:
                row: dict[str, Any] = get(cls.FromString(body))
                return row

            shape = Shape(top, decode)
            self.shapes[indexes] = shape
        return indexes, shape, payload[start:]


def parse_proto(text: str, deps: list[tuple[str, str]]) -> ProtoWriter:
    return ProtoWriter(text, deps)
