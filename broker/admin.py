"""The admin HTTP port: `GET /metrics` (Prometheus text, broker/metrics.py) and `GET /status`
(JSON: health of the object store, metadata database and catalog, and every table topic's
status). A minimal HTTP/1.1 server, one request per connection; it only reads in-memory state,
so a scrape never waits on storage."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

DEFAULT_ADDRESS = "127.0.0.1:9644"


async def serve_admin(
    host: str, port: int, metrics: Callable[[], bytes], status: Callable[[], dict[str, Any]]
) -> asyncio.Server:
    """Listen on host:port; `metrics()` gives the /metrics body, `status()` the /status JSON."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            if path.startswith("/metrics"):
                code, ctype, data = 200, "text/plain; version=0.0.4; charset=utf-8", metrics()
            elif path.startswith("/status"):
                code, ctype, data = 200, "application/json", json.dumps(status()).encode()
            else:
                code, ctype, data = 404, "text/plain", b"try /metrics or /status\n"
            writer.write(
                f"HTTP/1.1 {code} {'OK' if code == 200 else 'Not Found'}\r\n"
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
