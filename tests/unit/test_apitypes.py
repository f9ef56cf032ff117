"""Handlers' request/response types and strict response building (broker/handlers/base.py).

- broker/handlers/apitypes.py is what gen_apitypes renders from the registered version ranges
  (the unions the handlers are typed with cover exactly the versions they serve);
- `build` drops a value whose field only other served versions have, and raises on a name no
  served version has; `nested` likewise for class names;
- every handler answers every version it registers: a request filled with plausible values
  goes through decode_request and the handler; its answer is encoded, read back with kio's reader
  and encoded again to the same bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import struct
import types
import typing
import uuid
from pathlib import Path

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from broker.handlers import REGISTRY, BrokerContext, Later
from broker.handlers.base import (
    NO_RESPONSE,
    UnknownFieldError,
    build,
    nested,
    nested_or_none,
    schema_class,
)
from broker.handlers.gen_apitypes import path, registered_ranges, render
from broker.protocol.codec import (
    RequestHead,
    decode_request,
    encode_response,
    encode_response_parts,
)
from tests.producereq import same
from tests.rawclient import make_batch


def test_apitypes_module_is_up_to_date() -> None:
    assert Path(path()).read_text() == render(registered_ranges()), (
        "run `python -m broker.handlers.gen_apitypes`"
    )


def test_a_misspelled_field_raises() -> None:
    part = schema_class(0, 9, "PartitionProduceResponse")
    with pytest.raises(UnknownFieldError, match="eror_code"):
        build(part, index=0, eror_code=0, base_offset=0, record_errors=())


def test_a_field_of_newer_versions_only_is_dropped() -> None:
    old = schema_class(0, 3, "PartitionProduceResponse")  # no log_start_offset, record_errors
    made = build(old, index=1, error_code=0, base_offset=5, log_start_offset=0, record_errors=())
    assert not hasattr(made, "log_start_offset") and not hasattr(made, "record_errors")
    assert (made.index, made.base_offset) == (1, 5)


def test_nested_names_are_checked() -> None:
    v3 = RequestHead(0, 3, 1, None)
    v9 = RequestHead(0, 9, 1, None)
    assert nested_or_none(v3, "BatchIndexAndErrorMessage") is None  # from v8 on
    assert nested_or_none(v9, "BatchIndexAndErrorMessage") is not None
    with pytest.raises(UnknownFieldError):
        nested(v3, "BatchIndexAndErrorMessage")
    with pytest.raises(UnknownFieldError, match="PartitionProduceRespons'"):
        nested_or_none(v9, "PartitionProduceRespons")


# Values a request needs to reach a handler's answer-building code: by "Class.field" or field.
OVERRIDES: dict[str, object] = {
    "ProduceRequest.acks": 1,
    "transactional_id": None,
    # the transaction APIs need one (ctx has no coordinator: they answer an error)
    "EndTxnRequest.transactional_id": "tx",
    "AddOffsetsToTxnRequest.transactional_id": "tx",
    "TxnOffsetCommitRequest.transactional_id": "tx",
    "records": bytes(make_batch([b"v"])),
    "max_wait": datetime.timedelta(0),
    "min_bytes": 0,
    "max_bytes": 1 << 20,
    "partition_max_bytes": 1 << 20,
    "timestamp": -1,
    "group_instance_id": None,
    "generation_id": -1,
    "generation_id_or_member_epoch": -1,
    "JoinGroupRequest.member_id": "",
    "session_timeout": datetime.timedelta(seconds=10),
    "rebalance_timeout": datetime.timedelta(seconds=10),
    "CreatableTopic.assignments": (),
    "CreatableTopic.num_partitions": 1,
    "CreatableTopic.replication_factor": 1,
    "CreatableTopic.name": "created",
    "CreatableTopicConfig.name": "retention.ms",
    "CreatableTopicConfig.value": "1000",
    "AlterableConfig.name": "retention.ms",
    "AlterableConfig.value": "1000",
    "validate_only": True,
    "topic_names": ("gone",),
    "DeleteTopicState.name": "gone",
    "DescribeConfigsResource.resource_type": 2,
    "AlterConfigsResource.resource_type": 2,
    "OffsetCommitRequest.member_id": "",
    "configuration_keys": None,
    "config_operation": 0,
    "endpoint_type": 1,
    "producer_id": -1,
    "producer_epoch": -1,
    "count": 2,
}


def fill(cls: type, version: int) -> object:
    """An instance of a kio request class (or of a field type) with plausible values."""
    if dataclasses.is_dataclass(cls):
        values = {}
        for f in dataclasses.fields(cls):
            for key in (f"{cls.__name__}.{f.name}", f.name):
                if key in OVERRIDES:
                    values[f.name] = _coerce(f.type, OVERRIDES[key])
                    break
            else:
                if f.name == "group_id" and cls.__name__ == "JoinGroupRequest":
                    values[f.name] = f"join-{version}"  # a fresh group: no rebalance to wait for
                else:
                    values[f.name] = fill(typing.cast(type, f.type), version)
        return cls(**values)
    args = typing.get_args(cls)
    if isinstance(cls, types.UnionType) or typing.get_origin(cls) is typing.Union:
        return fill(next(a for a in args if a is not type(None)), version)
    if typing.get_origin(cls) is tuple:
        return (fill(args[0], version),)
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return next(iter(cls))
    if cls is bool:
        return True
    if isinstance(cls, type) and issubclass(cls, datetime.timedelta):
        return cls.parse(datetime.timedelta(seconds=1))
    if isinstance(cls, type) and issubclass(cls, datetime.datetime):
        return datetime.datetime.now(datetime.UTC)
    if cls is uuid.UUID:
        return uuid.UUID(int=1)
    if isinstance(cls, type) and issubclass(cls, bytes):
        return cls(b"")
    if isinstance(cls, type) and issubclass(cls, str):
        return cls("g") if "Group" in cls.__name__ else cls("t")
    if isinstance(cls, type) and issubclass(cls, int):
        return cls(0)
    raise AssertionError(f"no value for {cls!r}")


def _coerce(field_type: object, value: object) -> object:
    if isinstance(value, datetime.timedelta):
        for t in typing.get_args(field_type) or (field_type,):
            if isinstance(t, type) and issubclass(t, datetime.timedelta):
                return t.parse(value)
    return value


def frame_of(req: object, api_key: int, version: int) -> bytes:
    header_cls = RequestHeaderV2 if req.__flexible__ else RequestHeaderV1
    buf = io.BytesIO()
    header = header_cls(
        request_api_key=i16(api_key),
        request_api_version=i16(version),
        correlation_id=i32(7),
        client_id="test",
    )
    entity_writer(header_cls)(buf, header)
    entity_writer(type(req))(buf, req)
    return buf.getvalue()


async def test_every_handler_answers_every_version(ctx: BrokerContext) -> None:
    answered = 0
    for key, api in sorted(REGISTRY.items()):
        for version in range(api.min_version, api.max_version + 1):
            req = fill(load_request_schema(key, version), version)
            head, body = decode_request(frame_of(req, key, version), (version, version))
            assert same(body, req)
            result = await api.handle(ctx, head, body)
            if isinstance(result, Later):
                result = await result.coro
            assert result is not NO_RESPONSE, (key, version)
            frame = encode_response(key, version, 7, result)
            parts, size = encode_response_parts(key, version, 7, result)
            assert b"".join(parts) == frame and size == len(frame), (key, version)
            resp_cls = load_response_schema(key, version)
            assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
            _header, n = entity_reader(resp_cls.__header_schema__)(frame[4:], 0)
            decoded, _m = entity_reader(resp_cls)(frame[4:], n)
            assert encode_response(key, version, 7, decoded) == frame, (key, version)
            answered += 1
    assert answered == sum(a.max_version - a.min_version + 1 for a in REGISTRY.values())
