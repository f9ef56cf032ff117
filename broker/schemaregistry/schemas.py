"""One place that knows the schema types: parse a schema (with its references) and compare two.

`parse(schema_type, text, deps)` returns a `Parsed` schema, `deps` being the referenced
schemas in dependency order (each one's own references before it). `incompatibilities(level,
new, existing)` applies a compatibility level to a new schema and a subject's live versions
(oldest first) and lists what breaks it: BACKWARD (the new schema reads data written with the
latest), FORWARD (the latest reads data written with the new one), FULL (both), their
*_TRANSITIVE forms (against every live version), NONE (nothing is checked).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from broker.schemaregistry.avro import (
    avro_can_read,
    check_defaults,
    collect_names,
    parse_avro,
)
from broker.schemaregistry.errors import invalid_schema
from broker.schemaregistry.jsonschema_compat import json_can_read, parse_json_schema
from broker.schemaregistry.protobuf import parse_protobuf, proto_can_read
from broker.schemaregistry.store import Reference

TYPES = ("AVRO", "JSON", "PROTOBUF")
LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
          "FULL_TRANSITIVE")


@dataclass
class Parsed:
    schema_type: str
    canonical: str  # the text stored and served
    data: Any  # JSON data (AVRO, JSON) or a FileDescriptorProto (PROTOBUF)
    names: dict[str, Any] = field(default_factory=dict)  # AVRO: named types incl. references

    def fingerprint(self, refs: tuple[Reference, ...]) -> str:
        key = json.dumps([self.schema_type, self.canonical, [r.to_json() for r in refs]])
        return hashlib.sha256(key.encode()).hexdigest()


def parse(schema_type: str, text: str, deps: list[tuple[str, str, str]]) -> Parsed:
    """deps: (reference name, schema_type, text) of every referenced schema, dependencies
    first."""
    if schema_type not in TYPES:
        raise invalid_schema(f"unknown schema type {schema_type!r}")
    if schema_type == "AVRO":
        named: dict[str, Any] = {}
        names: dict[str, Any] = {}
        for _, dep_type, dep_text in deps:
            if dep_type != "AVRO":
                raise invalid_schema("an AVRO schema can only reference AVRO schemas")
            collect_names(parse_avro(dep_text, named), None, names)
        data = parse_avro(text, named)
        collect_names(data, None, names)
        check_defaults(names)
        return Parsed("AVRO", json.dumps(data, separators=(",", ":")), data, names)
    if schema_type == "JSON":
        data = parse_json_schema(text)
        return Parsed("JSON", json.dumps(data, separators=(",", ":")), data)
    if any(t != "PROTOBUF" for _, t, _ in deps):
        raise invalid_schema("a PROTOBUF schema can only reference PROTOBUF schemas")
    fd = parse_protobuf(text, [(name, dep_text) for name, _, dep_text in deps])
    return Parsed("PROTOBUF", text.strip(), fd)


def can_read(reader: Parsed, writer: Parsed) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` (empty list: it can)."""
    if reader.schema_type != writer.schema_type:
        return [f"schema type changed from {writer.schema_type} to {reader.schema_type}"]
    if reader.schema_type == "AVRO":
        return avro_can_read(reader.data, writer.data, reader.names, writer.names)
    if reader.schema_type == "JSON":
        return json_can_read(reader.data, writer.data)
    return proto_can_read(reader.data, writer.data)


def incompatibilities(level: str, new: Parsed, existing: list[tuple[int, Parsed]]) -> list[str]:
    """existing: (version, schema) of the subject's live versions, oldest first."""
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") else existing[-1:]
    base = level.removesuffix("_TRANSITIVE")
    out: list[str] = []
    for version, old in against:
        if base in ("BACKWARD", "FULL"):
            out += [f"version {version}, backward: {m}" for m in can_read(new, old)]
        if base in ("FORWARD", "FULL"):
            out += [f"version {version}, forward: {m}" for m in can_read(old, new)]
    return out
