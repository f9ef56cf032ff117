"""Compatibility rules per schema type and level (broker/schemaregistry/schemas.py and the
per-type modules): each case is a pair of schemas whose verdict follows from the Avro
specification's schema resolution, Confluent's JSON Schema content-model rules, or protobuf's
wire format, checked at every level it matters for."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from broker.schemaregistry.errors import RegistryError
from broker.schemaregistry.schemas import LEVELS, Parsed, incompatibilities, parse


def avro(fields: list[dict[str, Any]], name: str = "User") -> Parsed:
    return parse("AVRO", json.dumps({"type": "record", "name": name, "namespace": "t",
                                     "fields": fields}), [])


def ok(level: str, new: Parsed, *old: Parsed) -> bool:
    return not incompatibilities(level, new, list(enumerate(old, 1)))


V1 = avro([{"name": "id", "type": "int"}])
ADD_WITH_DEFAULT = avro([{"name": "id", "type": "int"},
                         {"name": "email", "type": "string", "default": ""}])
ADD_NO_DEFAULT = avro([{"name": "id", "type": "int"}, {"name": "email", "type": "string"}])


@pytest.mark.parametrize("level,expected", [
    ("BACKWARD", True), ("FORWARD", True), ("FULL", True), ("NONE", True)])
def test_avro_adding_a_field_with_a_default_is_fully_compatible(level: str, expected: bool
                                                               ) -> None:
    assert ok(level, ADD_WITH_DEFAULT, V1) is expected


@pytest.mark.parametrize("level,expected", [
    ("BACKWARD", False), ("FORWARD", True), ("FULL", False), ("NONE", True)])
def test_avro_adding_a_field_without_default(level: str, expected: bool) -> None:
    assert ok(level, ADD_NO_DEFAULT, V1) is expected


@pytest.mark.parametrize("level,expected", [
    ("BACKWARD", True), ("FORWARD", False), ("FULL", False)])
def test_avro_removing_a_field_without_default(level: str, expected: bool) -> None:
    # new schema V1 reads ADD_NO_DEFAULT data (ignores email); old cannot read new data
    assert ok(level, V1, ADD_NO_DEFAULT) is expected


def test_avro_removing_a_field_with_default_is_fully_compatible() -> None:
    assert ok("FULL", V1, ADD_WITH_DEFAULT)


def test_avro_promotions_follow_the_spec() -> None:
    as_long = avro([{"name": "id", "type": "long"}])
    assert ok("BACKWARD", as_long, V1)  # int written, read as long
    assert not ok("FORWARD", as_long, V1)  # long written, read as int: no
    for wider in ("float", "double"):
        assert ok("BACKWARD", avro([{"name": "id", "type": wider}]), V1)
    as_string = avro([{"name": "id", "type": "string"}])
    assert not ok("BACKWARD", as_string, V1)
    s = avro([{"name": "b", "type": "string"}])
    b = avro([{"name": "b", "type": "bytes"}])
    assert ok("FULL", s, b)


def enum(symbols: list[str], default: str | None = None) -> Parsed:
    e: dict[str, Any] = {"type": "enum", "name": "Color", "symbols": symbols}
    if default is not None:
        e["default"] = default
    return avro([{"name": "c", "type": e}])


def test_avro_enum_symbols() -> None:
    rgb, rg = enum(["R", "G", "B"]), enum(["R", "G"])
    assert ok("BACKWARD", rgb, rg)  # a symbol added: new reader knows every old symbol
    assert not ok("FORWARD", rgb, rg)  # old reader meets B
    assert not ok("BACKWARD", rg, rgb)  # a symbol removed
    assert ok("BACKWARD", enum(["R", "G"], default="R"), rgb)  # unless the reader has a default


def test_avro_unions() -> None:
    plain = avro([{"name": "x", "type": "string"}])
    nullable = avro([{"name": "x", "type": ["null", "string"], "default": None}])
    assert ok("BACKWARD", nullable, plain)  # writer string, reader union has string
    assert not ok("FORWARD", nullable, plain)  # writer null branch, reader only string
    wider = avro([{"name": "x", "type": ["null", "string", "int"], "default": None}])
    assert ok("BACKWARD", wider, nullable)
    assert not ok("BACKWARD", nullable, wider)  # int branch unreadable


def test_avro_renamed_record_is_incompatible_unless_aliased() -> None:
    other = avro([{"name": "id", "type": "int"}], name="Person")
    assert not ok("BACKWARD", other, V1)
    aliased = parse("AVRO", json.dumps({"type": "record", "name": "Person", "namespace": "t",
                                        "aliases": ["User"],
                                        "fields": [{"name": "id", "type": "int"}]}), [])
    assert ok("BACKWARD", aliased, V1)


def test_avro_recursive_and_nested_types() -> None:
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"},
        {"name": "next", "type": ["null", "Node"], "default": None}]}
    a = parse("AVRO", json.dumps(node), [])
    node2 = json.loads(json.dumps(node))
    node2["fields"][0]["type"] = "long"
    b = parse("AVRO", json.dumps(node2), [])
    assert ok("BACKWARD", b, a)
    assert not ok("FORWARD", b, a)
    m1 = avro([{"name": "m", "type": {"type": "map", "values": {"type": "array",
                                                               "items": "int"}}}])
    m2 = avro([{"name": "m", "type": {"type": "map", "values": {"type": "array",
                                                               "items": "long"}}}])
    assert ok("BACKWARD", m2, m1) and not ok("BACKWARD", m1, m2)


def test_transitive_levels_check_every_version() -> None:
    # v1 -> v2 adds email with default, v3 drops the default: v3 vs v2 backward fails too,
    # so use a chain where only the oldest breaks: v1 {id:int}, v2 {id:int, e default},
    # v3 {id:int, e no default} reads v2 data (e present) but not v1 data
    v3 = ADD_NO_DEFAULT
    assert ok("BACKWARD", v3, V1, ADD_WITH_DEFAULT)
    assert not ok("BACKWARD_TRANSITIVE", v3, V1, ADD_WITH_DEFAULT)
    # forward: old readers must read new data; v1 removed-field reader
    f2 = avro([{"name": "id", "type": "int"}, {"name": "x", "type": "int"}])
    f3 = avro([{"name": "id", "type": "long"}, {"name": "x", "type": "int"}])
    assert not ok("FORWARD", f3, V1, f2)  # f2 (int id) cannot read long id
    # full transitive: both ways against every version; dropping email breaks the readers of
    # the version that requires it
    assert ok("FULL", ADD_WITH_DEFAULT, V1, ADD_NO_DEFAULT)
    assert ok("FULL_TRANSITIVE", ADD_WITH_DEFAULT, V1, ADD_NO_DEFAULT)
    assert not ok("FULL_TRANSITIVE", V1, ADD_NO_DEFAULT, ADD_WITH_DEFAULT)
    assert ok("FULL_TRANSITIVE", ADD_WITH_DEFAULT, V1, ADD_WITH_DEFAULT)
    assert not ok("FORWARD_TRANSITIVE", V1, ADD_NO_DEFAULT, ADD_WITH_DEFAULT)


def test_every_level_is_known_and_none_checks_nothing() -> None:
    assert set(LEVELS) == {"NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD",
                           "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"}
    unrelated = avro([{"name": "q", "type": "boolean"}], name="Other")
    assert ok("NONE", unrelated, V1, ADD_NO_DEFAULT)
    for level in LEVELS[1:]:
        assert not ok(level, unrelated, V1)


def test_invalid_schemas_are_42201() -> None:
    for stype, text in [("AVRO", "{not json"), ("AVRO", '{"type": "record", "name": "X"}'),
                        ("AVRO", '"NoSuchType"'), ("JSON", '{"type": 12}'),
                        ("JSON", "[1, 2]"),
                        ("PROTOBUF", "syntax = \"proto3\"; message M { int32 a = 1 }"),
                        ("PROTOBUF", "syntax = \"proto3\"; import \"missing.proto\";"),
                        ("XML", "<a/>")]:
        with pytest.raises(RegistryError) as e:
            parse(stype, text, [])
        assert e.value.code == 42201, (stype, text)


def js(schema: dict[str, Any]) -> Parsed:
    return parse("JSON", json.dumps(schema), [])


def test_json_open_and_closed_content_models() -> None:
    open1 = js({"type": "object", "properties": {"a": {"type": "string"}}})
    open2 = js({"type": "object", "properties": {"a": {"type": "string"},
                                                 "b": {"type": "integer"}}})
    closed1 = js({"type": "object", "properties": {"a": {"type": "string"}},
                  "additionalProperties": False})
    closed2 = js({"type": "object", "properties": {"a": {"type": "string"},
                                                   "b": {"type": "integer"}},
                  "additionalProperties": False})
    assert not ok("BACKWARD", open2, open1)  # added to an open model: old data may hold b
    assert ok("BACKWARD", closed2, closed1)  # added to a closed model
    assert ok("BACKWARD", open1, open2)  # removed from an open model
    assert not ok("BACKWARD", closed1, closed2)  # removed from a closed model
    assert not ok("BACKWARD", closed1, open1)  # closing an open model


def test_json_types_required_enums_and_bounds() -> None:
    i = js({"type": "object", "properties": {"n": {"type": "integer"}}})
    n = js({"type": "object", "properties": {"n": {"type": "number"}}})
    assert ok("BACKWARD", n, i) and not ok("FORWARD", n, i)
    base = js({"type": "object", "properties": {"a": {"type": "string"}}})
    req = js({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    assert not ok("BACKWARD", req, base) and ok("FORWARD", req, base)
    e2 = js({"enum": ["x", "y"]})
    e3 = js({"enum": ["x", "y", "z"]})
    assert ok("BACKWARD", e3, e2) and not ok("BACKWARD", e2, e3)
    short = js({"type": "string", "maxLength": 5})
    long = js({"type": "string", "maxLength": 10})
    assert ok("BACKWARD", long, short) and not ok("BACKWARD", short, long)


def test_json_keywords_floe_does_not_compare_are_refused_when_changed() -> None:
    a = js({"anyOf": [{"type": "string"}, {"type": "integer"}]})
    b = js({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})
    problems = incompatibilities("BACKWARD", b, [(1, a)])
    assert problems and "not compared by floe" in problems[0]
    assert ok("FULL", a, a)


def proto(fields: list[tuple[str, int, int, int]], package: str = "t",
          messages: tuple[str, ...] = ("Msg",), syntax: str = "proto3") -> Parsed:
    fd = descriptor_pb2.FileDescriptorProto(name="t.proto", package=package, syntax=syntax)
    for mname in messages:
        m = fd.message_type.add(name=mname)
        for name, number, ftype, label in fields:
            m.field.add(name=name, number=number, type=ftype, label=label)
    return parse("PROTOBUF", base64.b64encode(fd.SerializeToString()).decode(), [])


F = descriptor_pb2.FieldDescriptorProto
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED


def test_protobuf_rules() -> None:
    v1 = proto([("id", 1, F.TYPE_INT32, OPT), ("name", 2, F.TYPE_STRING, OPT)])
    added = proto([("id", 1, F.TYPE_INT32, OPT), ("name", 2, F.TYPE_STRING, OPT),
                   ("age", 3, F.TYPE_INT64, OPT)])
    assert ok("FULL", added, v1) and ok("FULL", v1, added)  # fields added / removed
    renamed = proto([("ident", 1, F.TYPE_INT32, OPT), ("name", 2, F.TYPE_STRING, OPT)])
    assert ok("FULL", renamed, v1)
    widened = proto([("id", 1, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_BYTES, OPT)])
    assert ok("FULL", widened, v1)  # same wire type groups
    retyped = proto([("id", 1, F.TYPE_STRING, OPT), ("name", 2, F.TYPE_STRING, OPT)])
    assert not ok("BACKWARD", retyped, v1)
    repeated = proto([("id", 1, F.TYPE_INT32, REP), ("name", 2, F.TYPE_STRING, OPT)])
    assert not ok("BACKWARD", repeated, v1)
    other_pkg = proto([("id", 1, F.TYPE_INT32, OPT), ("name", 2, F.TYPE_STRING, OPT)],
                      package="u")
    assert not ok("BACKWARD", other_pkg, v1)
    two = proto([("id", 1, F.TYPE_INT32, OPT)], messages=("Msg", "Other"))
    one = proto([("id", 1, F.TYPE_INT32, OPT)])
    assert ok("BACKWARD", two, one) and not ok("BACKWARD", one, two)  # message removed
    one = proto([("id", 1, F.TYPE_INT32, OPT)], syntax="proto2")
    req = proto([("id", 1, F.TYPE_INT32, F.LABEL_REQUIRED)], syntax="proto2")
    assert not ok("BACKWARD", req, one) and not ok("BACKWARD", one, req)  # required changed
    req2 = proto([("id", 1, F.TYPE_INT32, OPT), ("must", 2, F.TYPE_INT32, F.LABEL_REQUIRED)],
                 syntax="proto2")
    assert not ok("BACKWARD", req2, one)  # a required field added
    assert not ok("BACKWARD", one, req2)  # a required field removed


def test_schema_types_never_mix() -> None:
    j = js({"type": "object"})
    assert not ok("BACKWARD", j, V1)


def test_protobuf_proto_text_is_compiled_by_protoc_with_its_references() -> None:
    common = 'syntax = "proto3";\npackage t;\nmessage Money { int64 cents = 1; }\n'
    v1_text = ('syntax = "proto3";\npackage t;\nimport "common.proto";\n'
               'import "google/protobuf/timestamp.proto";\n'
               'message Order { string id = 1; t.Money total = 2;'
               ' google.protobuf.Timestamp at = 3; }\n')
    deps = [("common.proto", "PROTOBUF", common)]
    v1 = parse("PROTOBUF", v1_text, deps)
    assert [f.name for f in v1.data.message_type[0].field] == ["id", "total", "at"]
    assert list(v1.data.dependency) == ["common.proto", "google/protobuf/timestamp.proto"]
    added = parse("PROTOBUF", v1_text.replace("at = 3;", "at = 3; repeated string tags = 4;"),
                  deps)
    assert ok("FULL", added, v1)
    retyped = parse("PROTOBUF", v1_text.replace("string id = 1", "int64 id = 1"), deps)
    problems = incompatibilities("BACKWARD", retyped, [(1, v1)])
    assert problems and "TYPE_STRING changed to TYPE_INT64" in problems[0]
    # the same schema as a base64 descriptor compares equal to its text form
    b64 = base64.b64encode(v1.data.SerializeToString()).decode()
    assert ok("FULL", parse("PROTOBUF", b64, deps), v1)
    with pytest.raises(RegistryError) as e:  # the reference is missing: protoc says so
        parse("PROTOBUF", v1_text, [])
    assert e.value.code == 42201 and "common.proto" in e.value.message
    with pytest.raises(RegistryError) as e:  # a reference name that is not a relative path
        parse("PROTOBUF", v1_text, [("../common.proto", "PROTOBUF", common)])
    assert e.value.code == 42201


@pytest.mark.parametrize("ftype,default,valid", [
    ("string", "", True), ("string", None, False), ("int", 3, True), ("int", 2**31, False),
    ("int", True, False), ("long", 2**40, True), ("double", 1, True), ("boolean", 0, False),
    (["null", "string"], None, True), (["string", "null"], None, True),
    (["null", "string"], 5, False), ({"type": "array", "items": "int"}, [1, 2], True),
    ({"type": "array", "items": "int"}, ["x"], False),
    ({"type": "map", "values": "long"}, {"a": 1}, True),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, "C", False),
    ({"type": "record", "name": "In", "fields": [{"name": "a", "type": "int"}]}, {"a": 1}, True),
    ({"type": "record", "name": "In", "fields": [{"name": "a", "type": "int"}]}, {}, False),
])
def test_avro_field_defaults_must_fit_their_type(ftype: Any, default: Any, valid: bool) -> None:
    text = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "f", "type": ftype, "default": default}]})
    if valid:
        parse("AVRO", text, [])
    else:
        with pytest.raises(RegistryError) as e:
            parse("AVRO", text, [])
        # fastavro refuses some itself ("Default value <x> must match"), floe the rest
        assert e.value.code == 42201 and "default" in e.value.message.lower()


def test_protobuf_base64_descriptors_must_build_with_their_imports() -> None:
    fd = descriptor_pb2.FileDescriptorProto(name="e.proto", package="t", syntax="proto3")
    m = fd.message_type.add(name="Event")
    m.field.add(name="at", number=1, type=F.TYPE_MESSAGE, label=OPT,
                type_name=".google.protobuf.Timestamp")
    m.field.add(name="who", number=2, type=F.TYPE_MESSAGE, label=OPT, type_name=".t.User")
    user = descriptor_pb2.FileDescriptorProto(name="u.proto", package="t", syntax="proto3")
    user.message_type.add(name="User").field.add(name="id", number=1, type=F.TYPE_INT64,
                                                 label=OPT)
    fd.dependency.extend(["google/protobuf/timestamp.proto", "user.proto"])

    def b64(f: descriptor_pb2.FileDescriptorProto) -> str:
        return base64.b64encode(f.SerializeToString()).decode()

    parse("PROTOBUF", b64(fd), [("user.proto", "PROTOBUF", b64(user))])
    user_text = 'syntax = "proto3";\npackage t;\nmessage User { int64 id = 1; }\n'
    parse("PROTOBUF", b64(fd), [("user.proto", "PROTOBUF", user_text)])
    with pytest.raises(RegistryError) as e:  # the reference is missing
        parse("PROTOBUF", b64(fd), [])
    assert e.value.code == 42201 and "user.proto" in e.value.message
    m.field.add(name="bad", number=3, type=F.TYPE_MESSAGE, label=OPT, type_name=".t.Nope")
    with pytest.raises(RegistryError) as e:  # a type nobody defines
        parse("PROTOBUF", b64(fd), [("user.proto", "PROTOBUF", b64(user))])
    assert e.value.code == 42201
