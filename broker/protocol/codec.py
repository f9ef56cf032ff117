"""Request/response framing on top of kio's schema-generated codecs. No I/O here.

A request frame (after the 4-byte size) starts with the request header: api_key int16,
api_version int16, correlation_id int32, client_id, then (flexible versions) tagged fields.
Which header version applies, and which response header version answers it, comes from the
schema classes themselves (`__header_schema__`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_reader

from broker.protocol.framecheck import MalformedFrame, check_request
from broker.protocol.heads import ProtocolError, RequestHead, UnsupportedVersionError
from broker.protocol.producerequest import PRODUCE_KEY, PRODUCE_VERSIONS, decode_produce
from broker.protocol.writer import Out, writer_of

__all__ = ["ProtocolError", "RequestHead", "UnsupportedVersionError", "decode_request"]

_PEEK = struct.Struct(">hhi")


@dataclass(frozen=True, slots=True)
class _Codec:
    request_type: type[Any]
    response_type: type[Any]
    read_header: Any
    read_body: Any
    response_header: type[Any]
    write_response_header: Any
    write_response: Any


@cache
def _codec(api_key: int, api_version: int) -> _Codec:
    req = load_request_schema(api_key, api_version)
    resp = load_response_schema(api_key, api_version)
    header: type[Any] = resp.__header_schema__
    return _Codec(
        request_type=req,
        response_type=resp,
        read_header=entity_reader(req.__header_schema__),
        read_body=entity_reader(req),
        response_header=header,
        write_response_header=writer_of(header),
        write_response=writer_of(resp),
    )


def peek(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame."""
    if len(frame) < _PEEK.size:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _PEEK.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def schema_versions(api_key: int) -> tuple[int, int] | None:
    """The version range kio has schemas for, or None for an unknown key."""
    from kio.index import _name_from_key
    from kio.schema.index import schema_name_map

    try:
        versions = schema_name_map[_name_from_key(api_key)]
    except UnknownAPIKey:
        return None
    return min(versions), max(versions)


def decode_request(
    frame: bytes | bytearray | memoryview, supported: tuple[int, int] | None, client_host: str = ""
) -> tuple[RequestHead, object]:
    """Decode a whole request frame (without its size prefix) into its header and body.

    `supported` is the broker's version range for the frame's api key (None: not served);
    `client_host` goes into the head (the network layer's "/address" of the peer)."""
    api_key, api_version, correlation_id = peek(frame)
    if supported is None or not supported[0] <= api_version <= supported[1]:
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    if api_key == PRODUCE_KEY:  # record sets as views into the frame, not copied
        if not PRODUCE_VERSIONS[0] <= api_version <= PRODUCE_VERSIONS[1]:
            raise UnsupportedVersionError(api_key, api_version, correlation_id)
        return decode_produce(frame, api_version, correlation_id, client_host)
    if not isinstance(frame, bytes):
        frame = memoryview(frame).toreadonly()  # kio reads read-only buffers only
    try:
        codec = _codec(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity) as e:
        raise UnsupportedVersionError(api_key, api_version, correlation_id) from e
    try:
        # Every length is checked against the frame before kio's native reader sees it (it
        # would reserve memory for any length it reads, and Rust aborts the process when that
        # fails); unknown tagged fields are cut out, as Kafka receivers skip them.
        checked = check_request(frame, codec.request_type.__header_schema__, codec.request_type)
        header, n = codec.read_header(checked, 0)
        body, _m = codec.read_body(checked, n)
    except MalformedFrame as e:
        raise ProtocolError(f"malformed api {api_key} v{api_version} request: {e}") from e
    except Exception as e:  # kio raises several types for malformed input
        raise ProtocolError(f"malformed api {api_key} v{api_version} request: {e!r}") from e
    except BaseException as e:  # a Rust panic in kio (pyo3's PanicException) is not an Exception
        if not _is_rust_panic(e):
            raise
        raise ProtocolError(f"api {api_key} v{api_version} request broke the decoder: {e!r}") from e
    # Bytes after the body are ignored, as Apache Kafka does: librdkafka 2.16 sends a null
    # topics array in Metadata v12 followed by three stray zero bytes.
    head = RequestHead(api_key, api_version, correlation_id, header.client_id, client_host)
    return head, body


def _is_rust_panic(e: BaseException) -> bool:
    return type(e).__name__ == "PanicException"


def response_type(api_key: int, api_version: int) -> type[Any]:
    return _codec(api_key, api_version).response_type


def encode_response_parts(
    api_key: int, api_version: int, correlation_id: int, response: object
) -> tuple[list[bytes | bytearray | memoryview], int]:
    """The size-prefixed response frame as parts to write one after the other (large record
    sets not copied: broker/protocol/writer.py), and its length."""
    codec = _codec(api_key, api_version)
    out = Out()
    codec.write_response_header(out, codec.response_header(correlation_id=correlation_id))
    codec.write_response(out, response)
    return out.parts()


def encode_response(
    api_key: int, api_version: int, correlation_id: int, response: object
) -> bytes:
    """The size-prefixed response frame, in one piece."""
    parts, _size = encode_response_parts(api_key, api_version, correlation_id, response)
    return b"".join(parts)
