"""A bounded walk over a request frame, driven by kio's schema classes, before kio decodes it.

Why: kio's native reader trusts the lengths it reads. An array length of four billion makes it
reserve 8 bytes per element up front, and when that allocation fails Rust aborts the whole
process (one packet from any client kills every connection). And it refuses tagged fields it
does not know, which the Kafka protocol says a receiver must skip.

`check_request` walks the frame exactly the way the schema says it is laid out, checks every
length (string, bytes, records, array count, tagged-field count and size, varint width) against
the bytes still left, and never allocates in proportion to a length it read. It returns the
frame to decode: the same object when nothing had to change, or a copy with every unknown
tagged field cut out (and each tagged-field count, and the size of any known tagged field
that held one, rewritten). After it passes, every length kio will read is bounded by the frame,
so kio allocates at most a small multiple of the frame size.

The walk is stricter than kio in a few ways that no correct client can trip over: an array
counts at least one byte per element, a nullable struct marker must be -1 or 1, varints are at
most 5 bytes (as in Apache Kafka), a known tagged field must take exactly its stated size, and
a null where the schema allows none (array, string, bytes) is refused, as Apache Kafka's
readers do (kio would hand the handler a None). It leaves to kio what kio checks (UTF-8) and
ignores bytes after the body (librdkafka sends some).

No I/O here; plans are compiled once per schema class.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from broker.protocol.writer import put_uvarint


class MalformedFrame(ValueError):
    """The frame does not fit its schema (a length runs past the end, a bad marker, ...)."""


# Field kinds of a compiled plan.
_FIXED = 0  # a fixed number of bytes
_LEGACY_STRING = 1  # int16 length, -1 = null
_LEGACY_BYTES = 2  # int32 length, -1 = null
_COMPACT = 3  # unsigned varint length + 1, 0 = null (compact string / bytes / records)
_ENTITY = 4  # a nested struct (optionally preceded by an int8 null marker)

_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_MAX_VARINT_BYTES = 5  # Kafka's unsigned varints are 32-bit

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

Edit = tuple[int, int, bytes]  # replace frame[start:end] by these bytes

MAX_ARRAY_ELEMENTS = 1_000_000
"""Array elements in one request, all arrays together. Each costs the walk and kio about
0.4 us and 60 bytes (a Python object); a 100 MiB frame of 2-byte elements would hold the
event loop for half a minute and take gigabytes. No client sends a million elements (a
Metadata request for every topic sends a null array), so more is refused."""


class _Edits(list[Edit]):
    """The edits a walk collects, and how many more array elements it may accept."""

    def __init__(self, elements_left: int | None = None) -> None:
        super().__init__()
        self.elements_left = MAX_ARRAY_ELEMENTS if elements_left is None else elements_left


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kind: int
    size: int  # bytes of a _FIXED value
    array: bool
    nullable_marker: bool  # a (non-array) struct that may be null: int8 marker first
    nullable: bool  # the array, string or bytes may be null (its schema says so)
    entity: _Plan | None
    min_size: int  # smallest encoding of one value (one array element, for arrays)


@dataclass(frozen=True, slots=True)
class _Plan:
    name: str
    flexible: bool
    fields: tuple[_Field, ...]
    tagged: dict[int, _Field]
    min_size: int


_plans: dict[object, _Plan] = {}


def plan_for(entity_type: type[Any]) -> _Plan:
    """The walk plan of a kio schema class (request, header or nested struct), compiled once."""
    plan = _plans.get(entity_type)
    if plan is None:
        plan = _plans[entity_type] = _compile(entity_type)
    return plan


def _compile(entity_type: type[Any]) -> _Plan:
    flexible = bool(entity_type.__flexible__)
    is_header = entity_type.__name__ == "RequestHeader"
    plain: list[_Field] = []
    tagged: dict[int, _Field] = {}
    for f in fields(entity_type):
        tag = get_field_tag(f)
        cls = classify_field(f)
        entity: _Plan | None = None
        size = 0
        nullable_marker = False
        if isinstance(cls, EntityField | EntityTupleField):
            kind = _ENTITY
            entity = plan_for(cls.type_)
            # kio reads tagged struct fields as not nullable (presence is the tag itself)
            nullable_marker = isinstance(cls, EntityField) and tag is None and is_optional(f)
            min_size = 1 if nullable_marker else entity.min_size
        else:
            assert isinstance(cls, PrimitiveField | PrimitiveTupleField)
            kafka_type = get_schema_field_type(f)
            if is_header and f.name == "client_id":
                kind, min_size = _LEGACY_STRING, 2  # always a legacy string, even in v2
            elif kafka_type in _FIXED_SIZES:
                kind, size = _FIXED, _FIXED_SIZES[kafka_type]
                min_size = size
            elif kafka_type in ("string", "bytes", "records"):
                if flexible:
                    kind, min_size = _COMPACT, 1
                elif kafka_type == "string":
                    kind, min_size = _LEGACY_STRING, 2
                else:
                    kind, min_size = _LEGACY_BYTES, 4
            else:
                raise TypeError(f"{entity_type.__name__}.{f.name}: kafka type {kafka_type!r}")
        # A null where the schema has no null is refused here, as Apache Kafka's readers do
        # (kio would hand handlers a None there); tagged fields are left to kio.
        nullable = is_optional(f) or tag is not None or (is_header and f.name == "client_id")
        field = _Field(f.name, kind, size, cls.is_array, nullable_marker, nullable, entity,
                       min_size)
        if tag is not None:
            tagged[int(tag)] = field
        else:
            plain.append(field)
    min_size = sum((1 if fl.array and flexible else 4 if fl.array else fl.min_size)
                   for fl in plain) + (1 if flexible else 0)
    return _Plan(entity_type.__name__, flexible, tuple(plain), tagged, min_size)


def check_request(
    frame: bytes | bytearray | memoryview, header_type: type[Any], body_type: type[Any]
) -> bytes | bytearray | memoryview:
    """Walk header and body of a request frame (without its size prefix); raise MalformedFrame
    if any length or count does not fit. Returns the frame kio may decode: `frame` itself, or
    a copy without the unknown tagged fields."""
    edits = _Edits()
    end = len(frame)
    try:
        pos = _walk(frame, 0, end, plan_for(header_type), edits)
        _walk(frame, pos, end, plan_for(body_type), edits)
    except struct.error as e:  # a fixed-size read past the end
        raise MalformedFrame(str(e)) from e
    if not edits:
        return frame
    return apply_edits(frame, edits)


def check_entity(
    buf: bytes | bytearray | memoryview, pos: int, entity_type: type[Any]
) -> bytes | bytearray | memoryview:
    """Like `check_request`, for one struct of `entity_type` at `pos` (an embedded message,
    e.g. a consumer subscription inside JoinGroup): the buffer kio may decode from `pos`."""
    edits = _Edits()
    try:
        _walk(buf, pos, len(buf), plan_for(entity_type), edits)
    except struct.error as e:
        raise MalformedFrame(str(e)) from e
    return apply_edits(buf, edits) if edits else buf


def apply_edits(frame: bytes | bytearray | memoryview, edits: list[Edit]) -> bytes:
    """`frame` with each (start, end, replacement) applied; edits must not overlap."""
    out = bytearray()
    prev = 0
    for start, stop, replacement in sorted(edits):
        out += frame[prev:start]
        out += replacement
        prev = stop
    out += frame[prev:]
    return bytes(out)


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    put_uvarint(out, value)
    return bytes(out)


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned varint at `pos`, at most 5 bytes, no byte
    at or after `end` (MalformedFrame otherwise)."""
    value = 0
    shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        if pos >= end:
            raise MalformedFrame(f"varint runs past the end at byte {pos}")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise MalformedFrame(f"varint longer than {_MAX_VARINT_BYTES} bytes at byte {pos}")


def _walk(
    buf: bytes | bytearray | memoryview, pos: int, end: int, plan: _Plan, edits: _Edits
) -> int:
    """Check one struct starting at `pos`, no byte at or after `end`; return where it ends."""
    for field in plan.fields:
        pos = _walk_field(buf, pos, end, field, plan.flexible, edits)
    if plan.flexible:
        pos = _walk_tagged(buf, pos, end, plan, edits)
    return pos


def _walk_field(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    field: _Field,
    flexible: bool,
    edits: _Edits,
) -> int:
    if not field.array:
        return _walk_value(buf, pos, end, field, edits)
    if flexible:
        n, pos = read_uvarint(buf, pos, end)
        count = n - 1  # 0 = null
    else:
        if end - pos < 4:
            raise MalformedFrame(f"array {field.name}: count runs past the end")
        (count,) = _I32.unpack_from(buf, pos)
        pos += 4
        if count < -1:
            raise MalformedFrame(f"array {field.name}: count {count}")
    if count == -1 and not field.nullable:
        raise MalformedFrame(f"array {field.name}: null, but it is not nullable")
    if count <= 0:
        return pos
    if count * max(field.min_size, 1) > end - pos:
        raise MalformedFrame(
            f"array {field.name}: {count} elements cannot fit in the {end - pos} bytes left"
        )
    edits.elements_left -= count
    if edits.elements_left < 0:
        raise MalformedFrame(f"more than {MAX_ARRAY_ELEMENTS} array elements in one request")
    if field.kind == _FIXED:
        return pos + count * field.size
    for _ in range(count):
        pos = _walk_value(buf, pos, end, field, edits)
    return pos


def _walk_value(
    buf: bytes | bytearray | memoryview, pos: int, end: int, field: _Field, edits: _Edits
) -> int:
    kind = field.kind
    if kind == _FIXED:
        pos += field.size
    elif kind == _COMPACT:
        n, pos = read_uvarint(buf, pos, end)
        if n > 0:
            pos += n - 1
        elif not field.nullable:
            raise MalformedFrame(f"{field.name}: null, but it is not nullable")
    elif kind == _LEGACY_STRING:
        if end - pos < 2:
            raise MalformedFrame(f"{field.name}: string length runs past the end")
        (n,) = _I16.unpack_from(buf, pos)
        pos += 2
        if n < -1:
            raise MalformedFrame(f"{field.name}: string length {n}")
        if n == -1 and not field.nullable:
            raise MalformedFrame(f"{field.name}: null, but it is not nullable")
        pos += max(n, 0)
    elif kind == _LEGACY_BYTES:
        if end - pos < 4:
            raise MalformedFrame(f"{field.name}: bytes length runs past the end")
        (n,) = _I32.unpack_from(buf, pos)
        pos += 4
        if n < -1:
            raise MalformedFrame(f"{field.name}: bytes length {n}")
        if n == -1 and not field.nullable:
            raise MalformedFrame(f"{field.name}: null, but it is not nullable")
        pos += max(n, 0)
    else:
        assert field.entity is not None
        if field.nullable_marker:
            if pos >= end:
                raise MalformedFrame(f"{field.name}: null marker runs past the end")
            (marker,) = _I8.unpack_from(buf, pos)
            pos += 1
            if marker == -1:
                return pos
            if marker != 1:
                raise MalformedFrame(f"{field.name}: null marker {marker}")
        return _walk(buf, pos, end, field.entity, edits)
    if pos > end:
        raise MalformedFrame(f"{field.name}: value runs {pos - end} bytes past the end")
    return pos


def _walk_tagged(
    buf: bytes | bytearray | memoryview, pos: int, end: int, plan: _Plan, edits: _Edits
) -> int:
    count_start = pos
    count, pos = read_uvarint(buf, pos, end)
    if count * 2 > end - pos:  # a tag and a size, one byte each at least
        raise MalformedFrame(f"{plan.name}: {count} tagged fields cannot fit")
    count_end = pos
    unknown = 0
    for _ in range(count):
        tag_start = pos
        tag, pos = read_uvarint(buf, pos, end)
        size_start = pos
        size, pos = read_uvarint(buf, pos, end)
        if size > end - pos:
            raise MalformedFrame(f"{plan.name}: tagged field {tag} of {size} bytes runs past"
                                 " the end")
        field = plan.tagged.get(tag)
        if field is None:  # Kafka: a receiver skips tagged fields it does not know
            edits.append((tag_start, pos + size, b""))
            unknown += 1
        else:
            inner = _Edits(edits.elements_left)
            stop = _walk_field(buf, pos, pos + size, field, True, inner)
            edits.elements_left = inner.elements_left
            if stop != pos + size:
                raise MalformedFrame(f"{plan.name}: tagged field {tag} ({field.name}) takes"
                                     f" {stop - pos} bytes, not {size}")
            if inner:
                new_size = size + sum(len(r) - (b - a) for a, b, r in inner)
                edits.append((size_start, pos, encode_uvarint(new_size)))
                edits.extend(inner)
        pos += size
    if unknown:
        edits.append((count_start, count_end, encode_uvarint(count - unknown)))
    return pos
