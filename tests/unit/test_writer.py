"""The compiled response writer (broker/protocol/writer.py) writes exactly kio's bytes.

Every response class of every version the broker serves (and both response headers) is filled
three ways, and each must encode byte for byte as kio's own `entity_writer` encodes it:
- "full": every field set, tagged fields away from their defaults (so they are written),
  arrays of two, non-ASCII strings, nullable structs present;
- "empty": nullable fields None, arrays empty (None where nullable), tagged fields at their
  defaults (so they are left out);
- "big": records of 64 KiB and more, which the writer keeps by reference (not copied), and
  the same records as a fetch's RecordSet of views.
A broken length, a field out of order, a tag written at its default: any differs from kio.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
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

from broker.handlers import REGISTRY
from broker.protocol.codec import encode_response, encode_response_parts
from broker.protocol.recordset import RecordSet
from broker.protocol.writer import BIG, Out, writer_of

SERVED = [
    (key, version)
    for key, api in sorted(REGISTRY.items())
    for version in range(api.min_version, api.max_version + 1)
]

_VALUES: dict[str, object] = {
    "int8": -3,
    "int16": -300,
    "int32": 70_000,
    "int64": 2**40 + 5,
    "uint8": 200,
    "uint16": 60_000,
    "uint32": 3_000_000_000,
    "uint64": 2**63 + 1,
    "float64": 1.5,
    "bool": True,
    "error_code": ErrorCode.not_leader_or_follower,
    "timedelta_i32": datetime.timedelta(milliseconds=1234),
    "timedelta_i64": datetime.timedelta(milliseconds=2**35),
    "datetime_i64": datetime.datetime(2026, 11, 27, 12, 0, 0, 123000, tzinfo=datetime.UTC),
    "uuid": uuid.UUID(int=0x1234_5678_9ABC_DEF0),
    "string": "tü-ß",
    "bytes": b"\x00\x01\xff",
    "records": b"\x00" * 61 + b"batch",
}


def _records(shape: str) -> object:
    if shape != "big":
        return _VALUES["records"]
    return bytes(range(256)) * (BIG // 256 + 3)  # a little over 64 KiB


def fill(cls: type[Any], shape: str, depth: int = 0) -> Any:
    values = {}
    for f in dataclasses.fields(cls):
        tag = get_field_tag(f)
        if tag is not None and shape == "empty":
            values[f.name] = (
                f.default if f.default is not dataclasses.MISSING
                else get_tagged_field_default(f)
            )
            continue
        values[f.name] = _value(f, shape, depth, tagged=tag is not None)
    return cls(**values)


def _value(f: dataclasses.Field[Any], shape: str, depth: int, tagged: bool) -> Any:
    kind = classify_field(f)
    optional = is_optional(f) and not tagged
    if shape == "empty" and optional:
        return None
    if isinstance(kind, PrimitiveField):
        t = get_schema_field_type(f)
        return _records(shape) if t == "records" else _VALUES[t]
    if isinstance(kind, PrimitiveTupleField):
        t = get_schema_field_type(f)
        return () if shape == "empty" else (_VALUES[t], _VALUES[t])
    if isinstance(kind, EntityField):
        return fill(kind.type_, shape, depth + 1)
    assert isinstance(kind, EntityTupleField)
    if shape == "empty" or depth > 4:
        return ()
    return (fill(kind.type_, shape, depth + 1), fill(kind.type_, shape, depth + 1))


def kio_bytes(cls: type[Any], value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)
    return buf.getvalue()


def ours(cls: type[Any], value: Any) -> tuple[bytes, Out]:
    out = Out()
    writer_of(cls)(out, value)
    parts, size = out.parts()
    frame = b"".join(parts)
    assert len(frame) == size
    return frame[4:], out


@pytest.mark.parametrize("shape", ["full", "empty", "big"])
@pytest.mark.parametrize(("key", "version"), SERVED)
def test_every_served_response_encodes_as_kio_does(key: int, version: int, shape: str) -> None:
    cls = load_response_schema(key, version)
    value = fill(cls, shape)
    mine, out = ours(cls, value)
    assert mine == kio_bytes(cls, value)
    header = cls.__header_schema__
    assert ours(header, header(correlation_id=7))[0] == kio_bytes(header, header(correlation_id=7))
    if shape == "big" and _has_records(cls):
        assert out.holes, "records of 64 KiB and more are written by reference"


def _has_records(cls: type[Any]) -> bool:
    for f in dataclasses.fields(cls):
        kind = classify_field(f)
        if isinstance(kind, PrimitiveField) and get_schema_field_type(f) == "records":
            return True
        if isinstance(kind, (EntityField, EntityTupleField)) and _has_records(kind.type_):
            return True
    return False


@pytest.mark.parametrize("version", range(REGISTRY[1].min_version, REGISTRY[1].max_version + 1))
def test_a_fetch_with_a_record_set_of_views_writes_them_as_they_are(version: int) -> None:
    cls = load_response_schema(1, version)
    data = bytes(range(256)) * 600
    views = (memoryview(data)[:70_000], memoryview(data)[70_000:])
    joined = fill(cls, "full")
    as_views = _with_records(joined, RecordSet(views, (len(data),), (9,)))
    joined = _with_records(joined, data)
    parts, size = encode_response_parts(1, version, 7, as_views)
    assert b"".join(parts) == encode_response(1, version, 7, joined)
    assert size == len(b"".join(parts))
    assert any(p is views[0] for p in parts), "the views are written, not copied"


def _with_records(value: Any, records: object) -> Any:
    """`value` with every records field set to `records`."""
    changes = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        kind = classify_field(f)
        if isinstance(kind, PrimitiveField) and get_schema_field_type(f) == "records":
            changes[f.name] = records
        elif isinstance(kind, EntityTupleField) and v:
            changes[f.name] = tuple(_with_records(x, records) for x in v)
        elif isinstance(kind, EntityField) and v is not None:
            changes[f.name] = _with_records(v, records)
    return dataclasses.replace(value, **changes)


def test_values_that_do_not_fit_raise() -> None:
    """A handler's bug (a length past int16, an int past its width, a None where the schema
    has none) raises, as kio's writer does: the connection is closed, nothing is sent."""
    header = load_response_schema(18, 0).__header_schema__
    cls = load_response_schema(0, 3)  # Produce v3: legacy strings
    value = fill(cls, "full")
    too_long = dataclasses.replace(
        value, responses=(dataclasses.replace(value.responses[0], name="x" * 40_000),)
    )
    with pytest.raises(struct.error):
        writer_of(cls)(Out(), too_long)
    with pytest.raises(struct.error):
        writer_of(header)(Out(), header(correlation_id=2**31))
    no_name = dataclasses.replace(
        value, responses=(dataclasses.replace(value.responses[0], name=None),)
    )
    with pytest.raises(TypeError):
        writer_of(cls)(Out(), no_name)
