"""The registry's HTTP server in-process (broker/schemaregistry/http.py) on a SQLite store:
keep-alive and pipelined requests, Confluent's response shapes and content type, the raw
`/schema` endpoints, and the connection limit (one more connection is answered 503, the ones
served keep working, and a freed slot serves again)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.schemaregistry import SchemaRegistry, serve_registry
from s3stream.metadata import MetadataStore

AVRO = json.dumps({"type": "record", "name": "A", "fields": [{"name": "x", "type": "int"}]})


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    meta = MetadataStore(tmp_path / "meta.db")
    await meta.open()
    reg = SchemaRegistry(meta)
    await reg.open()
    srv = await serve_registry(reg, "127.0.0.1", 0, max_connections=4)
    host, port = srv.sockets[0].getsockname()[:2]
    yield host, port
    srv.close()
    await meta.close()


def request(method: str, path: str, body: Any = None) -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/vnd.schemaregistry.v1+json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) != b"\r\n":
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, await reader.readexactly(int(headers["content-length"]))


async def test_pipelined_keep_alive_requests_get_confluent_answers(
        server: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*server)
    writer.write(request("POST", "/subjects/a/versions", {"schema": AVRO})
                 + request("GET", "/subjects/a/versions/latest")
                 + request("GET", "/subjects/a/versions/1/schema")
                 + request("GET", "/schemas/ids/1/schema")
                 + request("GET", "/subjects/a/versions/latest/referencedby")
                 + request("GET", "/subjects/nobody/versions"))
    answers = [await response(reader) for _ in range(6)]
    writer.close()
    assert [s for s, _, _ in answers] == [200, 200, 200, 200, 200, 404]
    assert all(h["content-type"] == "application/vnd.schemaregistry.v1+json"
               for _, h, _ in answers)
    assert json.loads(answers[0][2]) == {"id": 1}
    assert json.loads(answers[1][2]) == {"subject": "a", "version": 1, "id": 1,
                                         "schema": json.dumps(json.loads(AVRO),
                                                              separators=(",", ":"))}
    assert json.loads(answers[2][2]) == json.loads(AVRO)  # the schema itself, not wrapped
    assert answers[2][2] == answers[3][2]
    assert json.loads(answers[4][2]) == []
    assert json.loads(answers[5][2]) == {"error_code": 40401,
                                         "message": "Subject 'nobody' not found."}


async def test_one_connection_more_than_the_limit_gets_503(server: tuple[str, int]) -> None:
    held = [await asyncio.open_connection(*server) for _ in range(4)]
    for r, w in held:  # each one is being served
        w.write(request("GET", "/mode"))
        assert (await response(r))[0] == 200
    r5, w5 = await asyncio.open_connection(*server)
    status, _, body = await response(r5)
    assert status == 503 and json.loads(body)["error_code"] == 503
    assert await r5.read() == b""  # closed
    w5.close()
    _, w1 = held.pop()
    w1.close()
    await asyncio.sleep(0.1)
    r6, w6 = await asyncio.open_connection(*server)
    w6.write(request("GET", "/schemas/types"))
    assert (await response(r6))[0] == 200
    for r, w in [*held, (r6, w6)]:
        w.write(request("GET", "/subjects"))
        assert (await response(r))[0] == 200
        w.close()


async def test_expect_continue_and_accept_application_json(server: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*server)
    body = json.dumps({"schema": AVRO}).encode()
    writer.write(b"POST /subjects/c/versions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 b"Accept: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode())
    assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
    assert await reader.readline() == b"\r\n"
    writer.write(body)
    status, headers, payload = await response(reader)
    assert (status, headers["content-type"], json.loads(payload)) == (
        200, "application/json", {"id": 1})
    writer.close()


async def test_an_http_1_0_request_is_answered_and_closed(server: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*server)
    writer.write(b"GET /schemas/types HTTP/1.0\r\n\r\n")
    status, headers, body = await response(reader)
    assert (status, headers["connection"], json.loads(body)) == (
        200, "close", ["AVRO", "JSON", "PROTOBUF"])
    assert await reader.read() == b""
    writer.close()
