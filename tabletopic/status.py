"""Freshness you can see: `/status` (JSON) and `/metrics` (Prometheus text) over HTTP, and the
`floe table status` view of the same figures."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from typing import Any

StatusFn = Callable[[], list[dict[str, Any]]]


def prometheus(tables: list[dict[str, Any]]) -> str:
    lines = [
        "# HELP floe_table_lag_records Records in the log not yet committed to the table.",
        "# TYPE floe_table_lag_records gauge",
        "# HELP floe_table_lag_seconds Age of the oldest record not yet in the table.",
        "# TYPE floe_table_lag_seconds gauge",
        "# HELP floe_table_committed_offset Next offset the table holds.",
        "# TYPE floe_table_committed_offset gauge",
        "# HELP floe_table_log_end_offset Log end offset (high watermark).",
        "# TYPE floe_table_log_end_offset gauge",
        "# HELP floe_table_commits_total Iceberg commits made.",
        "# TYPE floe_table_commits_total counter",
        "# HELP floe_table_dead_letters_total Records sent to the dead-letter topic.",
        "# TYPE floe_table_dead_letters_total counter",
        "# HELP floe_table_last_commit_timestamp_seconds Time of the last commit.",
        "# TYPE floe_table_last_commit_timestamp_seconds gauge",
        "# HELP floe_table_error 1 while the last attempt failed.",
        "# TYPE floe_table_error gauge",
    ]
    for t in tables:
        labels = f'topic="{t["topic"]}",table="{t["table"]}"'
        lines.append(f"floe_table_commits_total{{{labels}}} {t['commits']}")
        lines.append(f"floe_table_dead_letters_total{{{labels}}} {t['dead_letters']}")
        lines.append(f"floe_table_error{{{labels}}} {1 if t['last_error'] else 0}")
        if t["last_commit"] is not None:
            lines.append(
                f"floe_table_last_commit_timestamp_seconds{{{labels}}} {t['last_commit']:.3f}"
            )
        for p in t["partitions"]:
            pl = f'{labels},partition="{p["partition"]}"'
            lines.append(f"floe_table_lag_records{{{pl}}} {p['lag_records']}")
            lines.append(f"floe_table_lag_seconds{{{pl}}} {p['lag_seconds']}")
            lines.append(f"floe_table_committed_offset{{{pl}}} {p['committed_offset']}")
            lines.append(f"floe_table_log_end_offset{{{pl}}} {p['log_end_offset']}")
    return "\n".join(lines) + "\n"


async def serve_status(host: str, port: int, status: StatusFn) -> asyncio.Server:
    """A minimal HTTP/1.1 server: GET /metrics and GET /status."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            if path.startswith("/metrics"):
                code, ctype, body = 200, "text/plain; version=0.0.4", prometheus(status())
            elif path.startswith("/status"):
                code, ctype, body = 200, "application/json", json.dumps({"tables": status()})
            else:
                code, ctype, body = 404, "text/plain", "try /metrics or /status\n"
            data = body.encode()
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

    return await asyncio.start_server(handle, host, port)


def fetch_status(address: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{address}/status", timeout=10) as r:
        tables: list[dict[str, Any]] = json.loads(r.read())["tables"]
        return tables


def render(tables: list[dict[str, Any]]) -> str:
    import time

    out = []
    for t in tables:
        last = f"{time.time() - t['last_commit']:.1f}s ago" if t["last_commit"] else "never"
        out.append(
            f"{t['topic']} -> {t['table']} ({t['value_type']}): {t['commits']} commits, "
            f"{t['rows']} rows, {t['dead_letters']} dead letters ({t['dlq_topic']}), "
            f"last commit {last}"
        )
        if t["last_error"]:
            out.append(f"  last error: {t['last_error']}")
        out.append(f"  {'PART':>4} {'LOG END':>10} {'COMMITTED':>10} {'LAG':>8} {'LAG s':>8}")
        for p in t["partitions"]:
            out.append(
                f"  {p['partition']:>4} {p['log_end_offset']:>10} "
                f"{p['committed_offset']:>10} {p['lag_records']:>8} "
                f"{p['lag_seconds']:>8.1f}" + (f"  STOPPED: {p['stopped']}" if p["stopped"] else "")
            )
    return "\n".join(out) if out else "no table topics"
