"""Protobuf (Confluent wire format: id, message indexes) -> Arrow for table topics
(tabletopic.protoconvert through tabletopic.schemaconvert): every type, message indexes,
evolution, bare messages (by_latest_schema) and what goes to the dead-letter topic. Schemas are
.proto text compiled by the registry's protoc path; test messages are built with protobuf's own
classes from the same descriptors."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from google.protobuf import message_factory

from broker.protocol.recordcodec import Record
from broker.schemaregistry.protobuf import descriptor_pool_of
from tabletopic.config import TableTopicConfig
from tabletopic.keyconvert import converter
from tabletopic.protoconvert import message_indexes
from tabletopic.schemaconvert import SchemaConverter

PROTO = """
syntax = "proto3";
package floe.test;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message All {
  enum Color { RED = 0; GREEN = 1; }
  message Inner { int32 x = 1; repeated string tags = 2; }
  int32 i32 = 1; sint32 s32 = 2; sfixed32 f32 = 3; int64 i64 = 4; uint32 u32 = 5;
  fixed32 fx32 = 6; uint64 u64 = 7; fixed64 fx64 = 8; float fl = 9; double db = 10;
  bool b = 11; string s = 12; bytes by = 13; Color color = 14; Inner inner = 15;
  repeated Inner inners = 16; repeated int64 nums = 17; map<string, int64> m = 18;
  map<int32, Inner> mi = 19; google.protobuf.Timestamp at = 20;
  google.protobuf.StringValue ws = 21; optional string opt = 22;
  oneof choice { string c_s = 23; int64 c_i = 24; }
}
message Other { string name = 1; message Deep { int64 v = 1; } }
"""
V1 = 'syntax = "proto3"; package e; message Ev { int32 id = 1; float score = 2; }'
V2 = ('syntax = "proto3"; package e; message Ev { int64 id = 1; double score = 2;'
      ' optional string note = 3; }')


def classes(text: str) -> dict[str, Any]:
    fdp, pool = descriptor_pool_of(text, [])
    f = pool.FindFileByName(fdp.name)
    out = {}
    for d in f.message_types_by_name.values():
        out[d.name] = message_factory.GetMessageClass(d)
        for n in d.nested_types:
            out[f"{d.name}.{n.name}"] = message_factory.GetMessageClass(n)
    return out


def wire(schema_id: int, indexes: bytes, msg: Any) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + msg.SerializeToString()


def rec(offset: int, value: bytes | None) -> Record:
    return Record(offset, 1_700_000_000_000 + offset, None, value, ())


def test_every_type_and_message_indexes() -> None:
    cls = classes(PROTO)
    m = cls["All"](i32=-1, s32=-2, f32=3, i64=2**40, u32=2**32 - 1, fx32=7, u64=2**63 - 1,
                   fx64=9, fl=1.5, db=2.25, b=True, s="héllo", by=b"\x00\x01", color=1,
                   nums=[1, 2], opt="o", c_i=5)
    m.inner.x = 4
    m.inner.tags.extend(["a", "b"])
    m.inners.add(x=1)
    m.m["k"] = 10
    m.mi[3].x = 8
    m.at.FromDatetime(dt.datetime(2024, 1, 2, 3, 4, 5, 678901))
    m.ws.value = "wrapped"
    empty = cls["All"]()
    deep = cls["Other.Deep"](v=42)
    c = SchemaConverter()
    c.add_schema(1, "PROTOBUF", PROTO)
    table, dead = c.convert(0, [rec(0, wire(1, b"\x00", m)), rec(1, wire(1, b"\x00", empty))])
    assert dead == [] and table is not None
    types = {f.name: f.type for f in table.schema}
    assert types["i32"] == types["s32"] == types["f32"] == pa.int32()
    assert types["i64"] == types["u32"] == types["fx32"] == types["u64"] == pa.int64()
    assert types["fl"] == pa.float32() and types["db"] == pa.float64()
    assert types["b"] == pa.bool_() and types["by"] == pa.binary()
    assert types["s"] == types["color"] == types["ws"] == types["opt"] == pa.string()
    inner = pa.struct([pa.field("x", pa.int32()), pa.field("tags", pa.list_(pa.string()))])
    assert types["inner"] == inner and types["inners"] == pa.list_(inner)
    assert types["m"] == pa.map_(pa.string(), pa.int64())
    assert types["mi"] == pa.map_(pa.int32(), inner)
    assert types["at"] == pa.timestamp("us", tz="UTC")
    assert types["c_s"] == pa.string() and types["c_i"] == pa.int64()
    row, zero = table.to_pylist()
    assert (row["i32"], row["s32"], row["u32"], row["u64"]) == (-1, -2, 2**32 - 1, 2**63 - 1)
    assert row["fl"] == 1.5 and row["s"] == "héllo" and row["by"] == b"\x00\x01"
    assert row["color"] == "GREEN" and row["inner"] == {"x": 4, "tags": ["a", "b"]}
    assert row["inners"] == [{"x": 1, "tags": []}] and row["nums"] == [1, 2]
    assert row["m"] == [("k", 10)] and row["mi"] == [(3, {"x": 8, "tags": []})]
    assert row["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    assert row["ws"] == "wrapped" and row["opt"] == "o"
    assert row["c_i"] == 5 and row["c_s"] is None  # oneof: the unset member is null
    # proto3 scalars without presence keep their defaults; fields with presence are null
    assert zero["i32"] == 0 and zero["s"] == "" and zero["color"] == "RED"
    assert zero["inner"] is None and zero["at"] is None and zero["ws"] is None
    assert zero["opt"] is None and zero["c_i"] is None
    # a nested message type, named by the indexes [1, 0] (zigzag: count 2, 1, 0)
    assert message_indexes(b"\x04\x02\x00") == ((1, 0), 3)
    t2, dead = c.convert(0, [rec(2, wire(1, b"\x04\x02\x00", deep))])
    assert dead == [] and t2 is not None and t2.column("v").to_pylist() == [42]


def test_evolution_adds_columns_and_promotes() -> None:
    c1, c2 = classes(V1)["Ev"], classes(V2)["Ev"]
    c = SchemaConverter()
    c.add_schema(1, "PROTOBUF", V1)
    c.add_schema(2, "PROTOBUF", V2)
    t1, _ = c.convert(0, [rec(0, wire(1, b"\x00", c1(id=1, score=0.5)))])
    assert t1 is not None and t1.schema.field("id").type == pa.int32()
    t2, dead = c.convert(0, [rec(1, wire(2, b"\x00", c2(id=2**40, score=0.25, note="n"))),
                             rec(2, wire(1, b"\x00", c1(id=3, score=1.5)))])
    assert dead == [] and t2 is not None
    assert t2.schema.field("id").type == pa.int64()
    assert t2.schema.field("score").type == pa.float64()
    assert [r["note"] for r in t2.to_pylist()] == ["n", None]
    assert [r["id"] for r in t2.to_pylist()] == [2**40, 3]


def test_bad_records_are_invalid_with_reason() -> None:
    ev = classes(V2)["Ev"]
    big = classes('syntax = "proto3"; message U { uint64 u = 1; }')["U"]
    c = SchemaConverter()
    c.add_schema(1, "PROTOBUF", V2)
    c.add_schema(2, "PROTOBUF", 'syntax = "proto3"; message U { uint64 u = 1; }')
    c.add_schema(3, "PROTOBUF", 'syntax = "proto3"; message N { N next = 1; }')
    c.add_schema(4, "PROTOBUF", 'syntax = "proto3"; message E { string id = 1; }')
    c.add_schema(5, "PROTOBUF", "message {")
    good = wire(1, b"\x00", ev(id=1))
    records = [rec(0, good[:5] + b"\x00\xff\xff"), rec(1, good[:5] + b"\x02\x0a"),
               rec(2, wire(2, b"\x00", big(u=2**64 - 1))), rec(3, wire(3, b"\x00", ev())),
               rec(4, b"\x00\x00\x00\x00\x04\x00"), rec(5, b"\x00\x00\x00\x00\x05\x00"),
               rec(6, good[:5] + b"\x80"), rec(7, good)]
    table, dead = c.convert(0, records)
    assert table is not None and table.column("id").to_pylist() == [1]
    reasons = {d.record.offset: d.reason for d in dead}
    assert "schema id 1: cannot decode" in reasons[0]
    assert "name no message" in reasons[1] and "does not fit a long" in reasons[2]
    assert "recursive" in reasons[3] and "Iceberg cannot" in reasons[4]
    assert "schema id 5" in reasons[5] and "truncated message indexes" in reasons[6]


def test_bare_messages_with_the_latest_schema() -> None:
    """by_latest_schema: no wire format, the file's first message type."""
    ev = classes(V2)["Ev"]
    c = SchemaConverter("by_latest_schema")
    t, dead = c.convert(0, [rec(0, ev(id=1).SerializeToString())])
    assert t is None and "no schema for the subject yet" in dead[0].reason
    c.add_schema(9, "PROTOBUF", V2)
    c.latest = 9
    t, dead = c.convert(0, [rec(1, ev(id=1, note="x").SerializeToString())])
    assert dead == [] and t is not None and t.to_pylist()[0]["note"] == "x"
    # table.topic.convert.value.message.full.name: another (here nested) message type
    settings = TableTopicConfig.of("t", {
        "table.topic.convert.value.type": "by_latest_schema",
        "table.topic.convert.value.message.full.name": "floe.test.Other.Deep"})
    named = converter(settings)
    assert isinstance(named, SchemaConverter)
    named.add_schema(1, "PROTOBUF", PROTO)
    named.latest = 1
    t, dead = named.convert(0, [rec(2, classes(PROTO)["Other.Deep"](v=5).SerializeToString())])
    assert dead == [] and t is not None and t.to_pylist()[0]["v"] == 5
    named.message_name = "floe.test.Nope"
    _t, dead = named.convert(0, [rec(3, b"")])
    assert "no message 'floe.test.Nope'" in dead[0].reason
