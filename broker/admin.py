"""The admin HTTP port: `GET /metrics` (Prometheus text, broker/metrics.py) and `GET /status`
(JSON: health of the object store, metadata database and catalog, and every table topic's
status). A minimal HTTP/1.1 server, one request per connection; it only reads in-memory state,
so a scrape never waits on storage."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

DEFAULT_ADDRESS = "127.0.0.1:9644"
# `/tables/...`: table operations (tabletopic.api): (method, path, query) -> (code, JSON)
TableRoutes = Callable[[str, str, dict[str, str]], Awaitable[tuple[int, dict[str, Any]]]]
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 409: "Conflict",
           500: "Internal Server Error", 503: "Service Unavailable"}


async def serve_admin(
    host: str,
    port: int,
    metrics: Callable[[], bytes],
    status: Callable[[], dict[str, Any]],
    tables: TableRoutes | None = None,
) -> asyncio.Server:
    """Listen on host:port; `metrics()` gives the /metrics body, `status()` the /status JSON,
    `tables` answers `/tables/...` (table operations; they may take a while)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            method, target = (parts[0], parts[1]) if len(parts) > 1 else ("GET", "/")
            url = urllib.parse.urlsplit(target)
            path = url.path
            if path.startswith("/tables/") and tables is not None:
                query = dict(urllib.parse.parse_qsl(url.query))
                code, doc = await tables(method, path, query)
                ctype, data = "application/json", json.dumps(doc).encode()
            elif path.startswith("/metrics"):
                code, ctype, data = 200, "text/plain; version=0.0.4; charset=utf-8", metrics()
            elif path.startswith("/status"):
                code, ctype, data = 200, "application/json", json.dumps(status()).encode()
            else:
                code, ctype, data = 404, "text/plain", b"try /metrics or /status\n"
            writer.write(
                f"HTTP/1.1 {code} {REASONS.get(code, 'Error')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, reuse_address=True)
