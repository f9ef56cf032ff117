"""The registry's REST API (Confluent's paths, bodies and error codes) on a small HTTP/1.1
server running on the broker's event loop (asyncio streams; no web framework is a dependency).

Bounds on hostile input: a request line or header line of at most 8 KiB, at most 100 headers,
a body of at most `MAX_BODY` bytes given by Content-Length (chunked bodies are refused with
411), 30 s to send a request, at most 1000 requests per connection. A request that breaks
them gets an error JSON and the connection is closed; nothing else is affected. At most
`max_connections` (512) connections are served at once; one more is answered 503 and closed.
Errors are `{"error_code": ..., "message": ...}`: Confluent's registry codes (see .errors),
plain HTTP codes for HTTP-level problems (404 unknown path, 405, 400 malformed JSON, 413 body
too large, 503 too many connections), 50001 for a store failure, 50000 for a bug (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from broker.schemaregistry.errors import RegistryError
from broker.schemaregistry.registry import SchemaRegistry, schema_extras
from broker.schemaregistry.schemas import TYPES

log = logging.getLogger("floe.schemaregistry")

MAX_LINE = 8192
MAX_HEADERS = 100
MAX_BODY = 8 * 1024 * 1024
REQUEST_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 512
MAX_REQUESTS_PER_CONNECTION = 1000
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 409: "Conflict", 411: "Length Required",
           413: "Payload Too Large", 422: "Unprocessable Entity",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}

Handler = Callable[["Request"], Awaitable[Any]]


class Request:
    def __init__(self, method: str, params: list[str], query: dict[str, list[str]],
                 body: bytes) -> None:
        self.method = method
        self.params = params
        self.query = query
        self.body = body

    def flag(self, name: str) -> bool:
        return self.query.get(name, ["false"])[-1].lower() == "true"

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body or b"{}")
        except (ValueError, RecursionError):
            raise RegistryError(400, 400, "Malformed JSON request body") from None
        if not isinstance(data, dict):
            raise RegistryError(422, 422, "Unrecognized request body: a JSON object expected")
        return data

    def schema_body(self) -> tuple[str, str | None, list[dict[str, Any]] | None]:
        data = self.json()
        schema, stype, refs = data.get("schema"), data.get("schemaType"), data.get("references")
        if not isinstance(schema, str):
            raise RegistryError(422, 42201, "Invalid schema: 'schema' must be a string")
        if stype is not None and not isinstance(stype, str):
            raise RegistryError(422, 42201, "Invalid schema: 'schemaType' must be a string")
        if refs is not None and not (isinstance(refs, list)
                                     and all(isinstance(r, dict) for r in refs)):
            raise RegistryError(422, 42201, "Invalid schema: 'references' must be a list")
        return schema, stype, refs


class RegistryHttp:
    """Routes Confluent's REST paths to a SchemaRegistry."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.r = registry
        seg = "([^/]+)"
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = [
            (m, re.compile(f"^{p.replace('{}', seg)}$"), h) for m, p, h in [
                ("GET", "/schemas/types", self.types),
                ("GET", "/schemas/ids/{}", self.schema_by_id),
                ("GET", "/schemas/ids/{}/schema", self.raw_schema_by_id),
                ("GET", "/schemas/ids/{}/subjects", self.id_subjects),
                ("GET", "/schemas/ids/{}/versions", self.id_versions),
                ("GET", "/subjects", self.subjects),
                ("POST", "/subjects/{}", self.lookup),
                ("DELETE", "/subjects/{}", self.delete_subject),
                ("GET", "/subjects/{}/versions", self.versions),
                ("POST", "/subjects/{}/versions", self.register),
                ("GET", "/subjects/{}/versions/{}", self.get_version),
                ("DELETE", "/subjects/{}/versions/{}", self.delete_version),
                ("GET", "/subjects/{}/versions/{}/schema", self.raw_version),
                ("GET", "/subjects/{}/versions/{}/referencedby", self.referenced_by),
                ("POST", "/compatibility/subjects/{}/versions/{}", self.compat_version),
                ("POST", "/compatibility/subjects/{}/versions", self.compat_all),
                ("GET", "/config", self.get_config),
                ("PUT", "/config", self.put_config),
                ("DELETE", "/config", self.delete_config),
                ("GET", "/config/{}", self.get_config),
                ("PUT", "/config/{}", self.put_config),
                ("DELETE", "/config/{}", self.delete_config),
                ("GET", "/mode", self.mode),
                ("GET", "/mode/{}", self.mode),
                ("GET", "/", self.root),
            ]]

    async def dispatch(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        """(HTTP status, JSON-able body) for one request; never raises."""
        try:
            parts = urlsplit(target)
            path = parts.path.rstrip("/") or "/"
            query = parse_qs(parts.query, max_num_fields=50)
            allowed = False
            for m, pattern, handler in self.routes:
                match = pattern.match(path)
                if match is None:
                    continue
                allowed = True
                if m == method:
                    params = [unquote(p) for p in match.groups()]
                    return 200, await handler(Request(method, params, query, body))
            if allowed:
                return 405, {"error_code": 405, "message": "HTTP 405 Method Not Allowed"}
            return 404, {"error_code": 404, "message": "HTTP 404 Not Found"}
        except RegistryError as e:
            return e.status, {"error_code": e.code, "message": e.message}
        except ValueError as e:  # e.g. too many query fields
            return 400, {"error_code": 400, "message": f"Bad request: {e}"}
        except Exception:
            log.exception("schema registry: %s %s failed", method, target[:200])
            return 500, {"error_code": 50000, "message": "Internal server error"}

    # -- handlers ------------------------------------------------------------------------------
    async def root(self, req: Request) -> Any:
        return {}

    async def types(self, req: Request) -> Any:
        return list(TYPES)

    @staticmethod
    def _id(text: str) -> int:
        if not text.isdigit() or int(text) > 2**31 - 1:
            raise RegistryError(404, 40403, "Schema not found")
        return int(text)

    async def schema_by_id(self, req: Request) -> Any:
        s = await self.r.formatted(await self.r.get_by_id(self._id(req.params[0])),
                                   req.query.get("format", [None])[-1])
        return {"schema": s.schema} | schema_extras(s)

    async def raw_schema_by_id(self, req: Request) -> Any:
        return RawText((await self.r.get_by_id(self._id(req.params[0]))).schema)

    async def id_subjects(self, req: Request) -> Any:
        rows = await self.r.id_usage(self._id(req.params[0]), req.flag("deleted"))
        return sorted({r.subject for r in rows})

    async def id_versions(self, req: Request) -> Any:
        rows = await self.r.id_usage(self._id(req.params[0]), req.flag("deleted"))
        return [{"subject": r.subject, "version": r.version} for r in rows]

    async def subjects(self, req: Request) -> Any:
        subjects = await self.r.subjects(req.flag("deleted"))
        prefix = req.query.get("subjectPrefix", [""])[-1]
        return [s for s in subjects if s.startswith(prefix)]

    async def lookup(self, req: Request) -> Any:
        schema, stype, refs = req.schema_body()
        sv = await self.r.lookup(req.params[0], schema, stype, refs, req.flag("deleted"))
        return sv.to_json()

    async def delete_subject(self, req: Request) -> Any:
        return await self.r.delete_subject(req.params[0], req.flag("permanent"))

    async def versions(self, req: Request) -> Any:
        return await self.r.versions(req.params[0], req.flag("deleted"))

    async def register(self, req: Request) -> Any:
        schema, stype, refs = req.schema_body()
        schema_id, _ = await self.r.register(req.params[0], schema, stype, refs)
        # exactly {"id": N}, as Confluent answers: older Java clients refuse unknown fields
        return {"id": schema_id}

    async def get_version(self, req: Request) -> Any:
        sv = await self.r.get_version(req.params[0], req.params[1], req.flag("deleted"))
        s = await self.r.formatted(sv.schema, req.query.get("format", [None])[-1])
        return dataclasses.replace(sv, schema=s).to_json()

    async def raw_version(self, req: Request) -> Any:
        sv = await self.r.get_version(req.params[0], req.params[1], req.flag("deleted"))
        return RawText(sv.schema.schema)

    async def referenced_by(self, req: Request) -> Any:
        return await self.r.referenced_by(req.params[0], req.params[1])

    async def delete_version(self, req: Request) -> Any:
        return await self.r.delete_version(req.params[0], req.params[1], req.flag("permanent"))

    async def _compat(self, req: Request, version: str | None) -> Any:
        schema, stype, refs = req.schema_body()
        problems = await self.r.check(req.params[0], version, schema, stype, refs)
        out: dict[str, Any] = {"is_compatible": not problems}
        if req.flag("verbose"):
            out["messages"] = problems
        return out

    async def compat_version(self, req: Request) -> Any:
        return await self._compat(req, req.params[1])

    async def compat_all(self, req: Request) -> Any:
        return await self._compat(req, None)

    async def get_config(self, req: Request) -> Any:
        subject = req.params[0] if req.params else None
        level = await self.r.get_config(subject, req.flag("defaultToGlobal"))
        return {"compatibilityLevel": level}

    async def put_config(self, req: Request) -> Any:
        data = req.json()
        level = data.get("compatibility", data.get("compatibilityLevel"))
        if not isinstance(level, str):
            raise RegistryError(422, 42203, "Invalid compatibility level")
        subject = req.params[0] if req.params else None
        return {"compatibility": await self.r.set_config(subject, level)}

    async def delete_config(self, req: Request) -> Any:
        subject = req.params[0] if req.params else None
        return {"compatibilityLevel": await self.r.delete_config(subject)}

    async def mode(self, req: Request) -> Any:
        return {"mode": "READWRITE"}


class RawText(str):
    """A handler result sent as the body itself (GET .../schema), not JSON-encoded."""


def _content_type(accept: str) -> str:
    """application/json when the client asks for it and not for Confluent's own type."""
    if "application/json" in accept and "schemaregistry" not in accept:
        return "application/json"
    return CONTENT_TYPE


def _response(status: int, body: Any, close: bool, content_type: str = CONTENT_TYPE) -> bytes:
    if isinstance(body, RawText):
        payload = str(body).encode()
    else:
        payload = json.dumps(body, separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n")
    return head.encode() + payload


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                        ) -> tuple[str, str, dict[str, str], bytes]:
    line = await reader.readuntil(b"\n")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(400, "malformed request line")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        h = await reader.readuntil(b"\n")
        if h in (b"\r\n", b"\n"):
            break
        name, sep, value = h.decode("latin-1").partition(":")
        if not sep:
            raise _Refused(400, "malformed header")
        headers[name.strip().lower()] = value.strip()
    else:
        raise _Refused(431, "too many headers")
    if parts[2] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"  # HTTP/1.0 closes after each response by default
    if "transfer-encoding" in headers:
        raise _Refused(411, "chunked bodies are not accepted; send Content-Length")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise _Refused(400, "bad Content-Length")
    length = int(length_text)
    if length > MAX_BODY:
        raise _Refused(413, f"request body larger than {MAX_BODY} bytes")
    if length and headers.get("expect", "").lower() == "100-continue":  # curl, large bodies
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await reader.readexactly(length) if length else b""
    return parts[0].upper(), parts[1], headers, body


async def _serve_connection(http: RegistryHttp, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
    try:
        for n in range(MAX_REQUESTS_PER_CONNECTION):
            try:
                method, target, headers, body = await asyncio.wait_for(
                    _read_request(reader, writer), REQUEST_TIMEOUT_S)
            except _Refused as e:
                writer.write(_response(e.status, {"error_code": e.status, "message": str(e)},
                                       True))
                await writer.drain()
                return
            except asyncio.LimitOverrunError:
                writer.write(_response(431, {"error_code": 431, "message": "line too long"},
                                       True))
                await writer.drain()
                return
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return
            status, result = await http.dispatch(method, target, body)
            close = (headers.get("connection", "").lower() == "close"
                     or n == MAX_REQUESTS_PER_CONNECTION - 1)
            writer.write(_response(status, result, close,
                                   _content_type(headers.get("accept", ""))))
            await writer.drain()
            if close:
                return
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve_registry(registry: SchemaRegistry, host: str, port: int,
                         max_connections: int = MAX_CONNECTIONS) -> asyncio.Server:
    http = RegistryHttp(registry)
    open_connections = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_connections
        if open_connections >= max_connections:
            writer.write(_response(503, {"error_code": 503,
                                         "message": "too many connections"}, True))
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
            writer.close()
            return
        open_connections += 1
        try:
            # an idle keep-alive connection at shutdown: its task is cancelled; end it quietly
            with contextlib.suppress(asyncio.CancelledError):
                await _serve_connection(http, reader, writer)
        finally:
            open_connections -= 1

    return await asyncio.start_server(on_connect, host, port, limit=MAX_LINE)
