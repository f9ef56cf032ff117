"""`floe table status`: reads a broker's `/status` (served on its admin port, broker/admin.py;
the table-topic metrics come from broker/metrics.py) and renders it for people."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def fetch_status(address: str) -> list[dict[str, Any]]:
    """The table topics of the broker whose admin port is `address`."""
    tables: list[dict[str, Any]] = fetch_full_status(address)["tables"]
    return tables


def fetch_full_status(address: str) -> dict[str, Any]:
    """The whole /status document: {"health": {...}, "tables": [...]}."""
    with urllib.request.urlopen(f"http://{address}/status", timeout=10) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return doc


def render_health(health: dict[str, Any]) -> str:
    """One line per unhealthy component, or nothing when all are ok."""
    import time

    out = []
    for name, c in health.get("components", {}).items():
        if not c["ok"]:
            ago = f" ({time.time() - c['last_error_at']:.0f}s ago)" if c["last_error_at"] else ""
            out.append(f"UNHEALTHY {name} {c['target']}: {c['last_error']}{ago}")
    return "\n".join(out)


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
        if t.get("paused"):
            out.append(f"  PAUSED: {t['paused']}")
        if t["last_error"]:
            out.append(f"  last error: {t['last_error']}")
        if t.get("costs"):
            out.append("  warehouse requests: " + ", ".join(
                f"{op} {c['requests']:.0f} ({c['bytes']:.0f} B)"
                for op, c in sorted(t["costs"].items())))
        coordinator = t.get("coordinator", {})
        if coordinator.get("active"):
            writers = ", ".join(f"{w['partition']}: broker {w['node_id']}"
                                for w in coordinator.get("workers", []))
            out.append(f"  coordinator: broker {coordinator['node_id']} (this one); partitions"
                       f" written by {writers or 'nobody yet'}")
        out.append(f"  {'PART':>4} {'WRITER':>6} {'LOG END':>10} {'COMMITTED':>10} {'LAG':>8}"
                   f" {'LAG s':>8} {'UNCONVERTED s':>13}")
        fresh = {f["partition"]: f for f in t.get("freshness", {}).get("partitions", [])}
        for p in t["partitions"]:
            conv = fresh.get(p["partition"], {}).get("ack_to_converted_seconds", 0.0)
            out.append(
                f"  {p['partition']:>4} {p.get('writer_node', '-'):>6} {p['log_end_offset']:>10} "
                f"{p['committed_offset']:>10} {p['lag_records']:>8} "
                f"{p['lag_seconds']:>8.1f} {conv:>13.1f}"
                + (f"  STOPPED: {p['stopped']}" if p["stopped"] else "")
            )
    return "\n".join(out) if out else "no table topics"
