"""Protobuf schemas: the `protobuf` library parses them; a subset of Confluent's rules compares.

Accepted form: a serialized `FileDescriptorProto`, base64-encoded, which is what Confluent's
Python serializers send and what Confluent's registry accepts besides `.proto` text. `.proto`
text (what the Java serializers send) is refused with 42201: the protobuf library has no .proto
parser, and the one well-kept compiler on PyPI (grpcio-tools' protoc) was not wired in.

`proto_can_read(reader, writer)` (both descriptors) lists incompatibilities, symmetric as
Confluent's rules are: a message type of the writer missing in the reader; a field number
whose type changes outside the wire-compatible groups {int32, uint32, int64, uint64, bool},
{sint32, sint64}, {fixed32, sfixed32}, {fixed64, sfixed64}, {string, bytes}; a field moving
between singular and repeated; a field's message or enum type changing name; a field moving
into or out of a oneof; the file's package changing. Added or removed fields, renamed fields
and added message types are compatible.
"""

from __future__ import annotations

import base64
import binascii

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from broker.schemaregistry.errors import invalid_schema

FDP = descriptor_pb2.FieldDescriptorProto
WIRE_GROUPS = [
    {FDP.TYPE_INT32, FDP.TYPE_UINT32, FDP.TYPE_INT64, FDP.TYPE_UINT64, FDP.TYPE_BOOL},
    {FDP.TYPE_SINT32, FDP.TYPE_SINT64},
    {FDP.TYPE_FIXED32, FDP.TYPE_SFIXED32},
    {FDP.TYPE_FIXED64, FDP.TYPE_SFIXED64},
    {FDP.TYPE_STRING, FDP.TYPE_BYTES},
]


def parse_protobuf(text: str) -> descriptor_pb2.FileDescriptorProto:
    """The file descriptor; RegistryError 42201 for anything but a base64 FileDescriptorProto."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        raise invalid_schema(
            "PROTOBUF schemas are accepted as a base64-encoded FileDescriptorProto only"
            " (.proto text is not supported by this registry)") from None
    if not fd.name:
        raise invalid_schema("the FileDescriptorProto has no file name")
    return fd


def _messages(fd: descriptor_pb2.FileDescriptorProto
              ) -> dict[str, descriptor_pb2.DescriptorProto]:
    out: dict[str, descriptor_pb2.DescriptorProto] = {}

    def walk(prefix: str, msgs: list[descriptor_pb2.DescriptorProto], depth: int) -> None:
        if depth > 100:
            raise invalid_schema("messages nested too deeply")
        for m in msgs:
            name = f"{prefix}.{m.name}"
            out[name] = m
            walk(name, list(m.nested_type), depth + 1)

    walk(f".{fd.package}" if fd.package else "", list(fd.message_type), 0)
    return out


def proto_can_read(reader: descriptor_pb2.FileDescriptorProto,
                   writer: descriptor_pb2.FileDescriptorProto) -> list[str]:
    out: list[str] = []
    if reader.package != writer.package:
        out.append(f"package changed from {writer.package!r} to {reader.package!r}")
    rmsgs, wmsgs = _messages(reader), _messages(writer)
    for name, wm in wmsgs.items():
        rm = rmsgs.get(name)
        if rm is None:
            out.append(f"{name}: message removed")
            continue
        rfields = {f.number: f for f in rm.field}
        for wf in wm.field:
            rf = rfields.get(wf.number)
            if rf is None:
                continue
            where = f"{name}.{wf.name} (#{wf.number})"
            if rf.type != wf.type and not any({rf.type, wf.type} <= g for g in WIRE_GROUPS):
                out.append(f"{where}: type {FDP.Type.Name(wf.type)} changed to"
                           f" {FDP.Type.Name(rf.type)}")
            elif rf.type_name != wf.type_name:
                out.append(f"{where}: type {wf.type_name} changed to {rf.type_name}")
            if (rf.label == FDP.LABEL_REPEATED) != (wf.label == FDP.LABEL_REPEATED):
                out.append(f"{where}: moved between singular and repeated")
            if rf.HasField("oneof_index") != wf.HasField("oneof_index") and not (
                    rf.proto3_optional or wf.proto3_optional):
                out.append(f"{where}: moved into or out of a oneof")
    return out
