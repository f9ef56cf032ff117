"""The console's (broker/console.py) sections on brokers, topics and costs, from the /status
document: the brokers (this one, or every live broker of a cluster), each topic's partitions
with their offsets, bytes in and out and throughput, and the object-store cost figures per
topic (broker/costs.py). Throughput is bytes per second over the last refresh window: the
admin server keeps a small ring of samples (`Throughput`), one per page served.

Element ids: `broker-N`, `lease-N`, `bytes-in-T-P`, `bytes-out-T-P`, `rate-in-T-P`, `rate-out-T-P`,
`cost-T-OP-requests`, `cost-T-OP-bytes` (OP: PUT, GET, DELETE, LIST)."""

from __future__ import annotations

import html
from collections import deque
from typing import Any

MIN_WINDOW_S = 0.5  # samples closer than this to now give no rate (a double reload)
RING = 16

Sample = tuple[float, dict[tuple[str, int], tuple[int, int]]]  # (time, {(t, p): (in, out)})
Rates = dict[tuple[str, int], tuple[float, float]]


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


class Throughput:
    """A ring of (time, bytes in and out per partition) samples; `sample()` adds one and gives
    bytes per second since the newest earlier sample at least MIN_WINDOW_S old."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=RING)

    def sample(self, topics: list[dict[str, Any]], now: float) -> tuple[Rates, float | None]:
        """(rates per partition, the window in seconds; None: no earlier sample yet)."""
        current = {(t["topic"], p["partition"]): (p["bytes_in"], p["bytes_out"])
                   for t in topics for p in t["partitions"]}
        base = next((s for s in reversed(self.samples) if now - s[0] >= MIN_WINDOW_S), None)
        self.samples.append((now, current))
        if base is None:
            return {}, None
        dt = now - base[0]
        rates = {}
        for k, (bin_, bout) in current.items():
            pin, pout = base[1].get(k, (0, 0))
            rates[k] = (max(0, bin_ - pin) / dt, max(0, bout - pout) / dt)
        return rates, dt


def brokers(doc: list[dict[str, Any]]) -> list[str]:
    out = [f"<h2>Brokers ({len(doc)})</h2>",
           "<table><tr><th>node</th><th class='l'>address</th><th class='l'>rack</th>"
           "<th class='l'>role</th><th>partitions led</th><th>lease left (s)</th></tr>"]
    for b in doc:
        role = ", ".join(r for r, on in (("this broker", b["this"]),
                                         ("controller", b["controller"])) if on)
        led = "" if b["partitions_led"] is None else b["partitions_led"]
        out.append(f"<tr id='broker-{b['node_id']}'><td>{b['node_id']}</td>"
                   f"<td class='l'>{e(b['host'])}:{b['port']}</td><td class='l'>"
                   f"{e(b['rack'] or '')}</td><td class='l'>{e(role)}</td><td>{led}</td>"
                   f"<td id='lease-{b['node_id']}'>{_opt(b.get('lease_remaining_s'))}</td></tr>")
    out.append("</table><p class='muted'>live brokers hold a lease in the metadata database, "
               "renewed every heartbeat; the partitions of one whose lease runs out move</p>")
    return out


def topics(doc: list[dict[str, Any]], rates: Rates, window: float | None) -> list[str]:
    span = f"over the last {window:.1f} s" if window is not None else "from the next refresh"
    out = [f"<h2>Topics ({len(doc)})</h2>",
           f"<p class='muted'>throughput {e(span)}</p>",
           "<table><tr><th class='l'>topic</th><th>partition</th><th>log start</th>"
           "<th>log end</th><th>bytes in</th><th>bytes out</th><th>in B/s</th>"
           "<th>out B/s</th></tr>"]
    for t in doc:
        for p in t["partitions"]:
            pid = f"{e(t['topic'])}-{p['partition']}"
            rin, rout = rates.get((t["topic"], p["partition"]), (None, None))
            out.append(
                f"<tr><td class='l'>{e(t['topic'])}</td><td>{p['partition']}</td>"
                f"<td>{_opt(p['log_start_offset'])}</td><td>{_opt(p['log_end_offset'])}</td>"
                f"<td id='bytes-in-{pid}'>{p['bytes_in']}</td>"
                f"<td id='bytes-out-{pid}'>{p['bytes_out']}</td>"
                f"<td id='rate-in-{pid}'>{_rate(rin)}</td>"
                f"<td id='rate-out-{pid}'>{_rate(rout)}</td></tr>")
    out.append("</table>")
    return out


def costs(doc: dict[str, Any]) -> list[str]:
    """Object-store requests and bytes per topic and operation (and what no topic got)."""
    rows = [(t, ops) for t, ops in doc.get("topics", {}).items()]
    rows.append(("(unattributed)", doc.get("unattributed", {})))
    out = ["<h2>Object-store costs by topic</h2>",
           "<p class='muted'>a WAL object's PUT is split over its topics by their bytes in it"
           " (fractional requests)</p>",
           "<table><tr><th class='l'>topic</th><th class='l'>op</th><th>requests</th>"
           "<th>bytes</th></tr>"]
    for topic, ops in rows:
        for op, c in sorted(ops.items()):
            cid = f"cost-{e(topic)}-{e(op)}"
            out.append(f"<tr><td class='l'>{e(topic)}</td><td class='l'>{e(op)}</td>"
                       f"<td id='{cid}-requests'>{c['requests']:.2f}</td>"
                       f"<td id='{cid}-bytes'>{c['bytes']:.0f}</td></tr>")
    out.append("</table>")
    return out


def table_costs(topic: str, ops: dict[str, dict[str, float]]) -> list[str]:
    """A table topic's warehouse requests and bytes (ids `tcost-T-OP-requests|bytes`)."""
    if not ops:
        return ["<p class='muted'>warehouse requests: none yet</p>"]
    cells = " &middot; ".join(
        f"{e(op)} <span id='tcost-{e(topic)}-{e(op)}-requests'>{c['requests']:.0f}</span> "
        f"(<span id='tcost-{e(topic)}-{e(op)}-bytes'>{c['bytes']:.0f}</span> B)"
        for op, c in sorted(ops.items()))
    return [f"<p>warehouse requests: {cells}</p>"]


def _opt(v: object) -> str:
    return "" if v is None else str(v)


def _rate(v: float | None) -> str:
    return "&ndash;" if v is None else f"{v:.1f}"
