"""Protobuf schemas: parsed by protobuf's own tools; a subset of Confluent's rules compares.

Accepted forms, as Confluent's registry accepts them:
- a serialized `FileDescriptorProto`, base64-encoded (what Confluent's Python serializers
  send), decoded by the `protobuf` library and built in a descriptor pool with its
  references and the well-known types it imports (so every type it names exists);
- `.proto` text (what the Java serializers send), compiled by protoc itself (grpcio-tools'
  `grpc_tools.protoc`) in a child process with a time limit, its imports being the schema's
  references (`.proto` text or base64 descriptors, by reference name) and protobuf's
  well-known types; at most two protoc processes run at once. Compiled descriptors are cached
  by their inputs, so the old versions a compatibility check compares are compiled once per
  process.
`serialized(fd)` gives the base64 form served for `?format=serialized`.

`proto_can_read(reader, writer)` (both descriptors) lists why data written with `writer` may
not be read with `reader`, after Confluent's Protobuf rules: a message type of the writer
missing in the reader (so a new message type is backward but not forward compatible, as in
Confluent); a field number whose type changes outside the wire-compatible groups {int32,
uint32, int64, uint64, bool}, {sint32, sint64}, {fixed32, sfixed32}, {fixed64, sfixed64},
{string, bytes}; a field moving between singular and repeated; a field's message or enum type
changing name; a field moving into or out of a oneof; a proto2 required field added, removed
or made (not) required; the file's package changing. Added or removed optional fields and
renamed fields are compatible.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import DecodeError

from broker.schemaregistry.errors import RegistryError, invalid_schema

PROTOC_TIMEOUT_S = 20.0
PROTOC_AT_ONCE = threading.BoundedSemaphore(2)  # protoc child processes running at once
MAIN_FILE = "floe_schema_main.proto"
WELL_KNOWN = re.compile(r"google/protobuf/[a-z_]+(/[a-z_]+)?\.proto")  # shipped by protobuf
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,254}$")

FDP = descriptor_pb2.FieldDescriptorProto
WIRE_GROUPS = [
    {FDP.TYPE_INT32, FDP.TYPE_UINT32, FDP.TYPE_INT64, FDP.TYPE_UINT64, FDP.TYPE_BOOL},
    {FDP.TYPE_SINT32, FDP.TYPE_SINT64},
    {FDP.TYPE_FIXED32, FDP.TYPE_SFIXED32},
    {FDP.TYPE_FIXED64, FDP.TYPE_SFIXED64},
    {FDP.TYPE_STRING, FDP.TYPE_BYTES},
]


def _from_base64(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    try:
        fd = descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(text.strip(), validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None
    return fd if fd.name else None


def parse_protobuf(text: str, deps: list[tuple[str, str]]
                   ) -> descriptor_pb2.FileDescriptorProto:
    """The file descriptor of a base64 FileDescriptorProto or of .proto text (compiled with
    `deps`: (import name, text) of every referenced schema); RegistryError 42201 if invalid."""
    fd = _from_base64(text)
    if fd is not None:
        _check_descriptor(fd, deps)
        return fd
    if any(name == MAIN_FILE for name, _ in deps):
        raise invalid_schema(f"reference name {MAIN_FILE} is reserved")
    size = len(text) + sum(len(t) for _, t in deps)
    compile_ = _compile_cached if size <= CACHED_INPUT_MAX else _compile
    return descriptor_pb2.FileDescriptorProto.FromString(compile_(text, tuple(deps)))


def descriptor_pool_of(text: str, deps: list[tuple[str, str]]
                       ) -> tuple[descriptor_pb2.FileDescriptorProto,
                                  descriptor_pool.DescriptorPool]:
    """The file descriptor of a schema (as `parse_protobuf`) and a descriptor pool holding it,
    its references and the well-known types it imports (table topics decode messages with
    it); RegistryError 42201 if invalid."""
    fd = parse_protobuf(text, deps)
    return fd, _check_descriptor(fd, deps)


def _check_descriptor(fd: descriptor_pb2.FileDescriptorProto, deps: list[tuple[str, str]]
                      ) -> descriptor_pool.DescriptorPool:
    """42201 unless fd builds in a descriptor pool holding its references (as named) and the
    well-known types it imports: every type it names must exist. Returns that pool."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(f: descriptor_pb2.FileDescriptorProto) -> None:
        for dep in f.dependency:
            if dep not in added and WELL_KNOWN.fullmatch(dep):
                module = "google.protobuf." + dep.removeprefix("google/protobuf/") \
                    .removesuffix(".proto").replace("/", ".") + "_pb2"
                try:
                    known = importlib.import_module(module)
                except ImportError:
                    continue  # not a well-known type protobuf ships: pool.Add will say so
                add(descriptor_pb2.FileDescriptorProto.FromString(
                    known.DESCRIPTOR.serialized_pb))
        if f.name not in added:
            added.add(f.name)
            pool.Add(f)

    try:
        for i, (name, dep_text) in enumerate(deps):  # dependencies come first
            dep_fd = _from_base64(dep_text) or descriptor_pb2.FileDescriptorProto.FromString(
                _compile_cached(dep_text, tuple(deps[:i])))
            dep_fd.name = name
            add(dep_fd)
        add(fd)
    except (TypeError, ValueError, KeyError) as e:
        raise invalid_schema(f"descriptor does not build: {e}") from None
    return pool


def serialized(fd: descriptor_pb2.FileDescriptorProto) -> str:
    """The base64 FileDescriptorProto form (`?format=serialized`)."""
    return base64.b64encode(fd.SerializeToString()).decode()


def _protoc_include() -> str:
    spec = importlib.util.find_spec("grpc_tools")  # run as a child process, never imported
    if spec is None or not spec.submodule_search_locations:
        raise invalid_schema(".proto text needs grpcio-tools (protoc), not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / "_proto")


def _compile(text: str, deps: tuple[tuple[str, str], ...]) -> bytes:
    """The serialized FileDescriptorProto protoc makes of text, its imports being deps."""
    include = _protoc_include()
    with tempfile.TemporaryDirectory(prefix="floe-proto-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        sets: list[str] = []
        for i, (name, dep_text) in enumerate(deps):
            if not SAFE_NAME.match(name) or ".." in name.split("/"):
                raise invalid_schema(f"reference name {name[:100]!r} is not a .proto path")
            dep_fd = _from_base64(dep_text)
            if dep_fd is not None:
                dep_fd.name = name
                path = Path(tmp) / f"dep{i}.pb"
                path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[dep_fd])
                                 .SerializeToString())
                sets.append(str(path))
            else:
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                (src / name).write_text(dep_text)
        (src / MAIN_FILE).write_text(text)
        out = Path(tmp) / "out.pb"
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"-I{include}",
               f"--descriptor_set_out={out}", MAIN_FILE]
        if sets:
            cmd.insert(3, f"--descriptor_set_in={os.pathsep.join(sets)}")
        try:
            with PROTOC_AT_ONCE:
                r = subprocess.run(cmd, capture_output=True, text=True,
                                   timeout=PROTOC_TIMEOUT_S, cwd=src, check=False)
        except subprocess.TimeoutExpired:
            raise invalid_schema("protoc took too long") from None
        if r.returncode != 0 or not out.exists():
            detail = (r.stderr or r.stdout).replace(str(src) + os.sep, "").strip()
            raise invalid_schema(f"protoc: {detail[:1000]}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    main = next((f for f in files if f.name == MAIN_FILE), None)
    if main is None:
        raise RegistryError(500, 50000, "protoc produced no descriptor")
    return bytes(main.SerializeToString())


# compiled descriptors of inputs up to 256 KiB: at most 256 x 256 KiB held
CACHED_INPUT_MAX = 256 * 1024
_compile_cached = functools.lru_cache(maxsize=256)(_compile)


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
        wnumbers = {f.number for f in wm.field}
        for added in rm.field:
            if added.label == FDP.LABEL_REQUIRED and added.number not in wnumbers:
                out.append(f"{name}.{added.name} (#{added.number}): required field added")
        for wf in wm.field:
            rf = rfields.get(wf.number)
            if rf is None:
                if wf.label == FDP.LABEL_REQUIRED:
                    out.append(f"{name}.{wf.name} (#{wf.number}): required field removed")
                continue
            if (rf.label == FDP.LABEL_REQUIRED) != (wf.label == FDP.LABEL_REQUIRED):
                out.append(f"{name}.{wf.name} (#{wf.number}): required changed")
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
