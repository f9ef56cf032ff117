"""Response encoding, compiled once per kio schema class: the bytes kio's `entity_writer`
writes, for a fraction of its CPU.

Why: a small Produce (one partition, a few records) cost ~175 us of the broker's Python at
fixed rate (issue 17), a third of it in kio's generic writer: a call per field through
`_Parts.write`, a Phantom type check per length (`uvarint(n)`, `i32(n)`), a BytesIO per
flexible struct for its tagged fields. Here each class becomes a list of steps made once:
consecutive fixed-width fields are packed with one `struct.Struct`, lengths and varints go
straight into one bytearray, and large record sets (`bytes` of 64 KiB or more, a fetch's
`RecordSet`) are kept by reference, as holes in it, so the response is written without
copying them (the size prefix comes first, filled in last).

What it relies on from kio is its schema classes' field metadata (`kafka_type`, `tag`, the
types kio's `_introspect` classifies), the same as broker/protocol/framecheck.py. The layout
rules are Kafka's (legacy vs compact lengths, nullable structs as an int8 marker, KIP-482
tagged fields in tag order, skipped while they hold their default), and
tests/unit/test_writer.py pins the bytes against kio's own writer for every response class
of every served version, filled with values of every shape (nulls, empties, tagged fields set).
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, fields
from operator import attrgetter
from typing import Any

from kio.serial._implicit_defaults import get_tagged_field_default
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

from broker.protocol.recordset import RecordSet

BIG = 64 * 1024  # a records value this large is written by reference, not copied

_SIZE = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ZERO_UUID = bytes(16)


class Out:
    """The frame being written: one bytearray (its first 4 bytes for the size), and the
    large values that go between its bytes, by reference (`holes`: position, value)."""

    __slots__ = ("buf", "held", "holes")

    def __init__(self) -> None:
        self.buf = bytearray(4)
        self.holes: list[tuple[int, Any]] = []
        self.held = 0  # the bytes of the holes

    def hole(self, data: Any) -> None:
        self.holes.append((len(self.buf), data))
        self.held += len(data)

    def parts(self) -> tuple[list[bytes | bytearray | memoryview], int]:
        """The size-prefixed frame as parts to write in order, and its length."""
        buf = self.buf
        size = len(buf) + self.held
        _SIZE.pack_into(buf, 0, size - 4)
        if not self.holes:
            return [buf], size
        view = memoryview(buf)
        out: list[bytes | bytearray | memoryview] = []
        at = 0
        for pos, data in self.holes:
            out.append(view[at:pos])
            if isinstance(data, RecordSet):
                out.extend(data.parts)
            else:
                out.append(data)
            at = pos
        out.append(view[at:])
        return out, size


Step = Callable[[Out, Any], None]  # writes one value (a field's, an array item) to Out


def put_uvarint(buf: bytearray, n: int) -> None:
    """Append Kafka's unsigned varint of `n` to `buf`."""
    if n < 0:
        raise ValueError(f"unsigned varint {n} < 0")
    while n >= 0x80:
        buf.append((n & 0x7F) | 0x80)
        n >>= 7
    buf.append(n)


# -- fixed-width values: a struct code and how the value becomes what struct packs ----------
def _ms_timedelta(v: datetime.timedelta) -> int:
    return round(v.total_seconds() * 1000)


def _ms_datetime(v: datetime.datetime | None) -> int:
    return -1 if v is None else round(v.timestamp() * 1000)


def _uuid_bytes(v: uuid.UUID | None) -> bytes:
    return _ZERO_UUID if v is None else v.bytes


def _ms_datetime_required(v: datetime.datetime) -> int:
    return round(v.timestamp() * 1000)


_FIXED: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "int8": ("b", None),
    "int16": ("h", None),
    "int32": ("i", None),
    "int64": ("q", None),
    "uint8": ("B", None),
    "uint16": ("H", None),
    "uint32": ("I", None),
    "uint64": ("Q", None),
    "float64": ("d", None),
    "bool": ("?", None),
    "error_code": ("h", None),  # an IntEnum: struct packs it as it is
    "timedelta_i32": ("i", _ms_timedelta),
    "timedelta_i64": ("q", _ms_timedelta),
    "uuid": ("16s", _uuid_bytes),
}


def _fixed(kafka_type: str, optional: bool) -> tuple[str, Callable[[Any], Any] | None] | None:
    if kafka_type == "datetime_i64":
        return "q", _ms_datetime if optional else _ms_datetime_required
    if kafka_type == "uuid" or not optional:
        return _FIXED.get(kafka_type)
    return None


# -- variable-width values ------------------------------------------------------------------
def _string_step(flexible: bool, optional: bool, records: bool) -> Step:
    def compact(out: Out, v: Any) -> None:
        if v is None:
            if not optional:
                raise TypeError("a non-nullable string or bytes field is None")
            out.buf.append(0)
            return
        if isinstance(v, str):
            v = v.encode()
        put_uvarint(out.buf, len(v) + 1)
        if records and (len(v) >= BIG or isinstance(v, RecordSet)):
            out.hole(v)
        else:
            out.buf += v

    def legacy_string(out: Out, v: Any) -> None:
        if v is None:
            if not optional:
                raise TypeError("a non-nullable string field is None")
            out.buf += b"\xff\xff"
            return
        b = v.encode()
        out.buf += _I16.pack(len(b))
        out.buf += b

    def legacy_bytes(out: Out, v: Any) -> None:
        if v is None:
            if not optional:
                raise TypeError("a non-nullable bytes field is None")
            out.buf += b"\xff\xff\xff\xff"
            return
        out.buf += _I32.pack(len(v))
        if records and (len(v) >= BIG or isinstance(v, RecordSet)):
            out.hole(v)
        else:
            out.buf += v

    if flexible:
        return compact
    return legacy_bytes if records else legacy_string


def _value_step(field: Field[Any], flexible: bool, optional: bool) -> Step:
    """How one value of a primitive field (or array item) is written."""
    kafka_type = get_schema_field_type(field)
    fixed = _fixed(kafka_type, optional)
    if fixed is not None:
        pack = struct.Struct(">" + fixed[0]).pack
        conv = fixed[1]

        def plain(out: Out, v: Any) -> None:
            out.buf += pack(v)

        if conv is None:
            return plain
        change = conv

        def converted(out: Out, v: Any) -> None:
            out.buf += pack(change(v))

        return converted
    if kafka_type == "string":
        return _string_step(flexible, optional, records=False)
    if kafka_type in ("bytes", "records"):
        return _string_step(flexible, optional, records=True)
    raise NotImplementedError(f"no writer for {kafka_type!r} (optional={optional})")


def _array_step(item: Step, flexible: bool) -> Step:
    def compact(out: Out, items: Sequence[Any] | None) -> None:
        if items is None:
            out.buf.append(0)
            return
        put_uvarint(out.buf, len(items) + 1)
        for it in items:
            item(out, it)

    def legacy(out: Out, items: Sequence[Any] | None) -> None:
        if items is None:
            out.buf += b"\xff\xff\xff\xff"
            return
        out.buf += _I32.pack(len(items))
        for it in items:
            item(out, it)

    return compact if flexible else legacy


def _field_step(field: Field[Any], flexible: bool, is_tag: bool) -> Step:
    """How a field's value is written (the value itself: the caller gets it)."""
    optional = False if is_tag else is_optional(field)  # as kio: presence is the tag's
    kind = classify_field(field)
    if isinstance(kind, PrimitiveField):
        return _value_step(field, flexible, optional)
    if isinstance(kind, PrimitiveTupleField):
        return _array_step(_value_step(field, flexible, False), flexible)
    if isinstance(kind, EntityField):
        return writer_of(kind.type_, nullable=optional)
    if isinstance(kind, EntityTupleField):
        return _array_step(writer_of(kind.type_), flexible)
    raise NotImplementedError(f"field {field.name}: {kind!r}")


_writers: dict[tuple[type[Any], bool], Step] = {}


def writer_of(cls: type[Any], nullable: bool = False) -> Step:
    """The compiled writer of a kio schema class (with an int8 null marker if nullable)."""
    step = _writers.get((cls, nullable))
    if step is None:
        step = _writers[(cls, nullable)] = _compile(cls, nullable)
    return step


def _compile(cls: type[Any], nullable: bool) -> Step:
    flexible = bool(cls.__flexible__)
    steps: list[Step] = []
    run: list[tuple[str, str, Callable[[Any], Any] | None]] = []  # fixed fields in a row
    tagged: list[tuple[int, str, Step, Any, Any]] = []

    def end_run() -> None:
        if run:
            steps.append(_packed(list(run)))
            run.clear()

    for f in fields(cls):
        tag = get_field_tag(f)
        if tag is not None:
            tagged.append((int(tag), f.name, _field_step(f, flexible, True), f.default,
                           get_tagged_field_default(f)))
            continue
        kind = classify_field(f)
        fixed = (
            _fixed(get_schema_field_type(f), is_optional(f))
            if isinstance(kind, PrimitiveField)
            else None
        )
        if fixed is not None:
            run.append((f.name, fixed[0], fixed[1]))
            continue
        end_run()
        steps.append(_get_then(f.name, _field_step(f, flexible, False)))
    end_run()
    if tagged and not flexible:
        raise ValueError(f"{cls.__name__}: tagged fields in a non-flexible struct")
    if flexible:
        steps.append(_tagged_step(sorted(tagged)) if tagged else _no_tags)

    def write(out: Out, entity: Any) -> None:
        for step in steps:
            step(out, entity)

    if not nullable:
        return write

    def write_nullable(out: Out, entity: Any) -> None:
        if entity is None:
            out.buf += b"\xff"
            return
        out.buf += b"\x01"
        write(out, entity)

    return write_nullable


def _packed(run: list[tuple[str, str, Callable[[Any], Any] | None]]) -> Step:
    """One struct for fixed-width fields in a row (attrgetter of several names: a tuple)."""
    pack = struct.Struct(">" + "".join(code for _, code, _ in run)).pack
    get = attrgetter(*(name for name, _, _ in run))
    convs = [(i, conv) for i, (_, _, conv) in enumerate(run) if conv is not None]

    def one(out: Out, e: Any) -> None:
        v = get(e)
        out.buf += pack(convs[0][1](v) if convs else v)

    def plain(out: Out, e: Any) -> None:
        out.buf += pack(*get(e))

    def converted(out: Out, e: Any) -> None:
        values = list(get(e))
        for i, conv in convs:
            values[i] = conv(values[i])
        out.buf += pack(*values)

    if len(run) == 1:
        return one
    return converted if convs else plain


def _get_then(name: str, step: Step) -> Step:
    get = attrgetter(name)
    return lambda out, e: step(out, get(e))


def _no_tags(out: Out, _e: Any) -> None:
    out.buf.append(0)


def _tagged_step(tagged: list[tuple[int, str, Step, Any, Any]]) -> Step:
    def write_tags(out: Out, e: Any) -> None:
        present = []
        for tag, name, step, default, implicit in tagged:
            v = getattr(e, name)
            if v == default or (default is MISSING and v == implicit):
                continue  # as kio: a field at its default is left out
            one = Out()
            step(one, v)
            parts, _size = one.parts()
            present.append((tag, b"".join(parts)[4:]))
        put_uvarint(out.buf, len(present))
        for tag, data in present:
            put_uvarint(out.buf, tag)
            put_uvarint(out.buf, len(data))
            out.buf += data

    return write_tags
