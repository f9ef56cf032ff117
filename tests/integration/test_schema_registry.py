"""The built-in Schema Registry against Confluent's own Python client and serializers.

A real broker process serves the registry (`--schema-registry 127.0.0.1:0`); the tests use
confluent-kafka's SchemaRegistryClient (registration, lookup, versions, deletes, config,
compatibility), its Avro, JSON Schema and Protobuf serializers producing through the broker
and deserializers consuming back equal objects, and raw HTTP for hostile input. Registry
contents survive SIGKILL + restart (SQLite) and are served by every broker sharing a
PostgreSQL metadata store.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.brokerproc import BrokerProcess

with warnings.catch_warnings():  # authlib (imported by the client) warns about httpx
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.schema_registry.json_schema import (
        JSONDeserializer,
        JSONSerializer,
    )
    from confluent_kafka.schema_registry.protobuf import (
        ProtobufDeserializer,
        ProtobufSerializer,
    )

pytestmark = pytest.mark.integration

USER_V1 = {"type": "record", "name": "User", "namespace": "floe.test",
           "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
USER_V2 = {**USER_V1, "fields": [*USER_V1["fields"],
                                 {"name": "email", "type": ["null", "string"],
                                  "default": None}]}
USER_BAD = {**USER_V1, "fields": [*USER_V1["fields"], {"name": "email", "type": "string"}]}


def avro(schema: dict[str, Any]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def registry_address(broker: BrokerProcess, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while not broker.registry:
        if time.monotonic() > deadline:
            raise RuntimeError("no `schema registry on` line:\n" + broker.log())
        time.sleep(0.02)
    return broker.registry


_open_clients: list[SchemaRegistryClient] = []


def client(broker: BrokerProcess) -> SchemaRegistryClient:
    """A new client (no cache shared with earlier ones); closed after the test."""
    c = SchemaRegistryClient({"url": f"http://{registry_address(broker)}"})
    _open_clients.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _open_clients:
        _open_clients.pop().close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(data_dir=tmp_path / "data", registry_listen="127.0.0.1:0").start()
    try:
        yield b
    finally:
        b.stop()


def sr_code(call: Any, *args: Any, **kw: Any) -> tuple[int, int]:
    """(HTTP status, Confluent error code) of a client call that must fail."""
    with pytest.raises(SchemaRegistryError) as e:
        call(*args, **kw)
    return e.value.http_status_code, e.value.error_code


def test_client_registers_looks_up_deletes_and_configures(broker: BrokerProcess) -> None:
    c = client(broker)
    sid = c.register_schema("users-value", avro(USER_V1))
    assert c.register_schema("users-value", avro(USER_V1)) == sid  # idempotent
    fresh = client(broker)  # no cache: ask the registry
    assert fresh.register_schema("users-value", avro(USER_V1)) == sid
    assert fresh.register_schema("other-value", avro(USER_V1)) == sid  # ids are global
    assert json.loads(fresh.get_schema(sid).schema_str) == USER_V1
    assert fresh.get_schema(sid).schema_type == "AVRO"
    assert sorted(fresh.get_subjects()) == ["other-value", "users-value"]
    looked = fresh.lookup_schema("users-value", avro(USER_V1))
    assert (looked.schema_id, looked.version, looked.subject) == (sid, 1, "users-value")
    assert sr_code(fresh.lookup_schema, "users-value", avro(USER_V2)) == (404, 40403)
    assert sr_code(fresh.lookup_schema, "nobody", avro(USER_V1)) == (404, 40401)

    # BACKWARD (default): a field with a default is fine, one without is refused with 409
    assert fresh.get_compatibility() == "BACKWARD"
    assert fresh.test_compatibility("users-value", avro(USER_V2))
    assert not fresh.test_compatibility("users-value", avro(USER_BAD))
    assert sr_code(fresh.register_schema, "users-value", avro(USER_BAD)) == (409, 409)
    sid2 = fresh.register_schema("users-value", avro(USER_V2))
    assert sid2 != sid
    latest = fresh.get_latest_version("users-value")
    assert (latest.version, latest.schema_id) == (2, sid2)
    assert fresh.get_version("users-value", 1).schema_id == sid
    assert fresh.get_versions("users-value") == [1, 2]
    assert sr_code(fresh.get_version, "users-value", 7) == (404, 40402)
    assert sr_code(fresh.get_version, "nobody", 1) == (404, 40401)
    assert sr_code(fresh.get_schema, 999999) == (404, 40403)

    # config: per subject and global, every level, bad level 42203
    assert fresh.set_compatibility("users-value", "NONE")["compatibility"] == "NONE"
    assert fresh.get_compatibility("users-value") == "NONE"
    assert fresh.register_schema("users-value", avro(USER_BAD)) > sid2  # NONE: anything
    for level in ("FORWARD", "FULL", "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE",
                  "FULL_TRANSITIVE", "BACKWARD"):
        fresh.set_compatibility(level=level)
        assert fresh.get_compatibility() == level
    assert sr_code(fresh.set_compatibility, "users-value", "SIDEWAYS") == (422, 42203)
    address = registry_address(broker)
    assert raw(address, "DELETE", "/config/users-value") == (200, {"compatibilityLevel": "NONE"})
    assert raw(address, "GET", "/config/users-value")[1]["error_code"] == 40408
    assert raw(address, "GET", "/config/users-value?defaultToGlobal=true")[1] == {
        "compatibilityLevel": "BACKWARD"}
    assert raw(address, "POST", "/compatibility/subjects/users-value/versions/1?verbose=true",
               json.dumps({"schema": json.dumps(USER_BAD)}).encode()) == (
        200, {"is_compatible": False, "messages": [
            "version 1, backward: /email: reader field 'email' is missing in the writer and"
            " has no default"]})
    assert raw(address, "GET", f"/schemas/ids/{sid}/subjects")[1] == ["other-value",
                                                                       "users-value"]
    assert raw(address, "GET", f"/schemas/ids/{sid}/versions")[1] == [
        {"subject": "other-value", "version": 1}, {"subject": "users-value", "version": 1}]

    # references: a record type defined in another subject, used by name
    address_schema = {"type": "record", "name": "Address", "namespace": "floe.test",
                      "fields": [{"name": "city", "type": "string"}]}
    fresh.register_schema("address", avro(address_schema))
    person = {"type": "record", "name": "Person", "namespace": "floe.test",
              "fields": [{"name": "home", "type": "floe.test.Address"}]}
    pid = fresh.register_schema("person", Schema(json.dumps(person), "AVRO", [
        SchemaReference("floe.test.Address", "address", 1)]))
    got = fresh.get_schema(pid)
    assert [(r.name, r.subject, r.version) for r in got.references] == [
        ("floe.test.Address", "address", 1)]
    assert raw(address, "GET", "/subjects/address/versions/1/referencedby")[1] == [pid]
    assert sr_code(fresh.delete_version, "address", 1) == (422, 42206)
    status, body = raw(address, "POST", "/subjects/person/versions",
                       json.dumps({"schema": json.dumps(person)}).encode())
    assert (status, body["error_code"]) == (422, 42201)  # Address unknown without the ref

    # deletes: soft, then permanent; the error codes of doing them in the wrong order
    assert sr_code(fresh.delete_subject, "other-value", permanent=True) == (404, 40405)
    assert fresh.delete_subject("other-value") == [1]
    assert sr_code(fresh.delete_subject, "other-value") == (404, 40404)
    assert "other-value" not in fresh.get_subjects()
    assert sr_code(fresh.get_versions, "other-value") == (404, 40401)
    assert fresh.delete_subject("other-value", permanent=True) == [1]
    assert sr_code(fresh.delete_subject, "other-value") == (404, 40401)
    assert fresh.delete_version("users-value", 3) == 3
    assert fresh.get_versions("users-value") == [1, 2]
    assert sr_code(fresh.delete_version, "users-value", 2, permanent=True) == (404, 40407)
    assert fresh.get_schema(sid).schema_str  # still held by users-value version 1
    assert fresh.register_schema("users-value", avro(USER_V2)) == sid2  # still live: same


def test_avro_json_and_protobuf_serializers_round_trip_through_the_broker(
        broker: BrokerProcess) -> None:
    c = client(broker)
    records: list[tuple[str, Any, Any]] = []  # topic, serializer, deserializer
    avro_ser = AvroSerializer(c, json.dumps(USER_V1))
    avro_de = AvroDeserializer(client(broker))
    json_schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order",
                   "type": "object", "properties": {"id": {"type": "integer"},
                                                    "item": {"type": "string"}},
                   "required": ["id"]}
    json_ser = JSONSerializer(json.dumps(json_schema), c)
    json_de = JSONDeserializer(None, schema_registry_client=client(broker))
    fd = descriptor_pb2.FileDescriptorProto(name="floe_test_point.proto", package="floetest",
                                            syntax="proto3")
    m = fd.message_type.add(name="Point")
    m.field.add(name="x", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    m.field.add(name="label", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    point = message_factory.GetMessageClass(pool.FindMessageTypeByName("floetest.Point"))
    proto_ser = ProtobufSerializer(point, c, {"use.deprecated.format": False})
    proto_de = ProtobufDeserializer(point, {"use.deprecated.format": False})
    records = [("sr-avro", avro_ser, avro_de), ("sr-json", json_ser, json_de),
               ("sr-proto", proto_ser, proto_de)]
    values: dict[str, list[Any]] = {
        "sr-avro": [{"name": f"n{i}", "age": i} for i in range(20)],
        "sr-json": [{"id": i, "item": f"thing {i}"} for i in range(20)],
        "sr-proto": [point(x=i * 1000, label=f"p{i}") for i in range(20)],
    }
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for topic, ser, _ in records:
        for v in values[topic]:
            producer.produce(topic, value=ser(v, SerializationContext(topic, MessageField.VALUE)))
    assert producer.flush(20) == 0
    for topic, _, de in records:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
                             "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while len(got) < len(values[topic]) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                raw = msg.value()
                assert raw[0] == 0  # Confluent's wire format: magic byte, then the schema id
                got.append(de(raw, SerializationContext(topic, MessageField.VALUE)))
        finally:
            consumer.close()
        assert got == values[topic], topic
    fresh = client(broker)
    assert sorted(fresh.get_subjects()) == ["sr-avro-value", "sr-json-value", "sr-proto-value"]
    proto_schema = fresh.get_latest_version("sr-proto-value").schema
    assert proto_schema.schema_type == "PROTOBUF"
    stored = descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(proto_schema.schema_str))
    assert stored == fd
    assert fresh.get_latest_version("sr-json-value").schema.schema_type == "JSON"


def test_registry_survives_sigkill_and_restart(tmp_path: Path) -> None:
    b = BrokerProcess(data_dir=tmp_path / "data", registry_listen="127.0.0.1:0").start()
    try:
        c = client(b)
        ids = [c.register_schema(f"s{i}", avro({**USER_V1, "name": f"T{i}"}))
               for i in range(5)]
        c.set_compatibility("s0", "FULL")
        c.delete_subject("s4")
        address = registry_address(b)
        b.kill()
        b.registry_listen, b.registry = address, ""
        b.start()
        fresh = client(b)
        assert sorted(fresh.get_subjects()) == ["s0", "s1", "s2", "s3"]
        assert [fresh.get_latest_version(f"s{i}").schema_id for i in range(4)] == ids[:4]
        assert fresh.get_compatibility("s0") == "FULL"
        assert sr_code(fresh.delete_subject, "s4") == (404, 40404)
        new_id = fresh.register_schema("s5", avro({**USER_V1, "name": "T5"}))
        assert new_id not in ids  # ids are never handed out twice
    finally:
        b.stop()


def test_every_broker_on_postgresql_serves_the_same_registry(tmp_path: Path,
                                                              pg_url: str) -> None:
    objects = f"file://{tmp_path / 'objects'}"
    args = ["--metadata", pg_url, "--object-store", objects]
    a = BrokerProcess(data_dir=tmp_path / "a", extra_args=args,
                      registry_listen="127.0.0.1:0").start()
    b = BrokerProcess(data_dir=tmp_path / "b", extra_args=[*args, "--node-id", "1"],
                      registry_listen="127.0.0.1:0").start()
    try:
        ca, cb = client(a), client(b)
        sid = ca.register_schema("pg-value", avro(USER_V1))
        assert json.loads(cb.get_schema(sid).schema_str) == USER_V1
        assert cb.register_schema("pg-value", avro(USER_V1)) == sid
        assert sr_code(cb.register_schema, "pg-value", avro(USER_BAD)) == (409, 409)
        sid2 = cb.register_schema("pg-value", avro(USER_V2))
        assert client(a).get_latest_version("pg-value").schema_id == sid2
        assert client(a).get_versions("pg-value") == [1, 2]
    finally:
        a.stop()
        b.stop()


def raw(address: str, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, Any]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers={
            "Content-Type": "application/vnd.schemaregistry.v1+json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else None
    finally:
        conn.close()


def test_hostile_http_gets_confluent_errors_and_the_broker_keeps_serving(
        broker: BrokerProcess) -> None:
    address = registry_address(broker)
    status, body = raw(address, "POST", "/subjects/x/versions", b"{not json")
    assert (status, body["error_code"]) == (400, 400)
    status, body = raw(address, "POST", "/subjects/x/versions", b'{"schema": 5}')
    assert (status, body["error_code"]) == (422, 42201)
    status, body = raw(address, "POST", "/subjects/x/versions",
                       json.dumps({"schema": '{"type": "nope"}'}).encode())
    assert (status, body["error_code"]) == (422, 42201)
    status, body = raw(address, "POST", "/subjects/x/versions",
                       json.dumps({"schema": "{}", "schemaType": "XML"}).encode())
    assert (status, body["error_code"]) == (422, 42201)
    status, body = raw(address, "POST", "/subjects/x/versions",
                       json.dumps({"schema": json.dumps(USER_V1),
                                   "references": [{"name": "a", "subject": "missing",
                                                   "version": 1}]}).encode())
    assert (status, body["error_code"]) == (422, 42201)
    assert raw(address, "GET", "/no/such/path")[0] == 404
    assert raw(address, "GET", "/subjects/x/versions/zero")[1]["error_code"] == 42202
    assert raw(address, "GET", "/subjects/x/versions/0")[1]["error_code"] == 42202
    assert raw(address, "GET", "/schemas/ids/-3")[1]["error_code"] == 40403
    assert raw(address, "PUT", "/config", b'{"compatibility": 3}')[1]["error_code"] == 42203
    assert raw(address, "PATCH", "/config")[0] == 405
    # a body larger than the limit is refused from its Content-Length, unread
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /subjects/x/versions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 1000000000\r\n\r\n")
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413")
    # a header line longer than the limit, garbage, a truncated request
    for junk in (b"GET / HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
                 b"\x00\xff garbage\r\n\r\n", b"GET /subjects HTTP/1.1\r\nContent-Le"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            try:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                reply = s.recv(65536)
            except ConnectionResetError:  # closed with our junk unread: refused all the same
                reply = b""
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply[:100]
    # still serving, registry and Kafka alike
    assert raw(address, "GET", "/subjects") == (200, [])
    assert raw(address, "GET", "/schemas/types")[1] == ["AVRO", "JSON", "PROTOBUF"]
    assert raw(address, "GET", "/mode") == (200, {"mode": "READWRITE"})
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("after-junk", b"v")
    assert producer.flush(10) == 0


def test_proto_text_schemas_as_java_clients_send_them(broker: BrokerProcess) -> None:
    """`.proto` text with a reference (what Confluent's Java serializers register) is compiled
    by protoc; Python serde reads it as the base64 descriptor (`?format=serialized`)."""
    c = client(broker)
    common = 'syntax = "proto3";\npackage shop;\nmessage Money { int64 cents = 1; }\n'
    order = ('syntax = "proto3";\npackage shop;\nimport "common.proto";\n'
             'message Order { string id = 1; shop.Money total = 2; }\n')
    c.register_schema("common", Schema(common, "PROTOBUF"))
    oid = c.register_schema("orders-value", Schema(order, "PROTOBUF", [
        SchemaReference("common.proto", "common", 1)]))
    assert client(broker).get_schema(oid).schema_str == order.strip()  # text as registered
    assert sr_code(c.register_schema, "orders-value", Schema(
        order.replace("string id = 1", "int64 id = 1"), "PROTOBUF", [
            SchemaReference("common.proto", "common", 1)])) == (409, 409)
    assert sr_code(c.register_schema, "broken", Schema("message {", "PROTOBUF")) == (422, 42201)

    # the descriptors the registry serves, loaded into a pool: the classes serde uses
    address = registry_address(broker)
    pool = descriptor_pool.DescriptorPool()
    for subject, name in (("common", "common.proto"), ("orders-value", None)):
        status, body = raw(address, "GET", f"/subjects/{subject}/versions/latest?format=serialized")
        assert status == 200
        fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(body["schema"]))
        if name:
            fd.name = name
        pool.Add(fd)
    order_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    money_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Money"))
    ser = ProtobufSerializer(order_cls, c, {"auto.register.schemas": False,
                                            "use.latest.version": True,
                                            "use.deprecated.format": False})
    de = ProtobufDeserializer(order_cls, {"use.deprecated.format": False})
    sent = [order_cls(id=f"o{i}", total=money_cls(cents=i * 99)) for i in range(10)]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for m in sent:
        producer.produce("orders", value=ser(m, SerializationContext("orders",
                                                                    MessageField.VALUE)))
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-orders"})
    try:
        consumer.assign([TopicPartition("orders", 0, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                assert int.from_bytes(msg.value()[1:5], "big") == oid
                got.append(de(msg.value(), SerializationContext("orders", MessageField.VALUE)))
    finally:
        consumer.close()
    assert got == sent


def test_a_registry_port_in_use_is_logged_and_the_broker_still_serves_kafka(
        tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = BrokerProcess(data_dir=tmp_path / "data",
                          registry_listen=f"127.0.0.1:{port}").start()
        try:
            producer = Producer({"bootstrap.servers": b.bootstrap})
            producer.produce("still-up", b"v")
            assert producer.flush(10) == 0
            deadline = time.monotonic() + 10
            while "not served" not in b.log() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert f"schema registry 127.0.0.1:{port} not served" in b.log()
            assert b.registry == ""
        finally:
            b.stop()
