"""The admin HTTP port: `GET /metrics` (Prometheus text, broker/metrics.py), `GET /status`
(JSON: health of the object store, metadata database and catalog, and every table topic's
status), `GET /` (the web console, broker/console.py) and `/tables/...` (table operations,
tabletopic.api). A minimal HTTP/1.1 server, one request per connection; /metrics and /status
only read in-memory state, so a scrape never waits on storage (the console and the table
operations read the catalog)."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.console_cluster import Throughput

DEFAULT_ADDRESS = "127.0.0.1:9644"
LINEAGE_TIMEOUT_S = 5.0  # the console's wait for each table's snapshots
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
    from broker.console_cluster import Throughput

    throughput = Throughput()  # samples of bytes in/out per partition, one per console page

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
            elif path == "/":
                code, ctype, data = 200, "text/html; charset=utf-8", await _console(
                    status(), tables, metrics().decode(), throughput)
            else:
                code, ctype, data = 404, "text/plain", b"try /, /metrics or /status\n"
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


async def _console(doc: dict[str, Any], tables: TableRoutes | None, metrics: str,
                   throughput: Throughput) -> bytes:
    """The console page (broker/console.py) with each table topic's snapshots, each lineage
    bounded by LINEAGE_TIMEOUT_S (the catalog may be slow or down: the page still renders)."""
    from broker.console import page

    lineages: dict[str, dict[str, Any]] = {}
    for t in doc.get("tables", []) if tables is not None else []:
        assert tables is not None
        try:
            _code, lineages[t["topic"]] = await asyncio.wait_for(
                tables("GET", f"/tables/{t['topic']}/lineage", {}), LINEAGE_TIMEOUT_S)
        except TimeoutError:
            lineages[t["topic"]] = {"error": f"no answer within {LINEAGE_TIMEOUT_S:g} s"}
    return page(doc, lineages, metrics, throughput)
