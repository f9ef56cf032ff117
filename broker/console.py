"""The web console on the admin port's `/`: one server-rendered HTML page (no script, no build
step) made from the same documents as `/status` and `/tables/T/lineage`, refreshed by the
browser every 5 s: the health of what the broker depends on, and per table topic the writer's
state, lag and per-stage freshness per partition, dead letters, errors and the latest
snapshots with the offsets each holds; from the `/metrics` exposition, object-store requests
and errors by operation and consumer groups with their lag. Elements a test or a script may
read carry ids: `lag-T-P`, `lag-seconds-T-P`, `dlq-T`, `state-T`, `group-lag-G-T-P`,
`tcost-T-OP-requests|bytes`; brokers, topics with throughput and costs per topic:
broker/console_cluster.py (its ids there)."""

from __future__ import annotations

import datetime
import html
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from broker import console_cluster as cluster

STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:.2em .6em;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}.bad{color:#b00;font-weight:bold}
.ok{color:#070}.muted{color:#777}"""
SNAPSHOTS_SHOWN = 10


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def page(status: dict[str, Any], lineages: dict[str, dict[str, Any]], metrics: str = "",
         throughput: cluster.Throughput | None = None) -> bytes:
    """The console for a /status document, the lineage of (some of) its table topics and the
    /metrics exposition (consumer groups, object store); `throughput` keeps the samples that
    give bytes per second between pages."""
    now = time.time()
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<meta http-equiv='refresh' content='5'><title>floe console</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>floe broker</h1><p class='muted'>{e(_at(now))} UTC &middot; "
        "<a href='/status'>/status</a> &middot; <a href='/metrics'>/metrics</a></p>",
    ]
    out += _health(status.get("health", {}))
    out += cluster.brokers(status.get("brokers", []))
    if "topics" in status:
        rates, window = (throughput or cluster.Throughput()).sample(status["topics"], now)
        out += cluster.topics(status["topics"], rates, window)
    samples = _samples(metrics)
    out += _object_store(samples)
    if "costs" in status:
        out += cluster.costs(status["costs"])
    tables = status.get("tables", [])
    out.append(f"<h2>Table topics ({len(tables)})</h2>")
    if not tables:
        out.append("<p class='muted'>none</p>")
    for t in tables:
        out += _table(t, lineages.get(t["topic"]), now)
    out += _groups(samples)
    out.append("</body></html>")
    return "\n".join(out).encode()


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(metrics: str) -> Samples:
    """{sample name: [(labels, value)]} of a Prometheus exposition."""
    out: Samples = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _object_store(samples: Samples) -> list[str]:
    errors = {labels.get("op", ""): v
              for labels, v in samples.get("floe_object_store_errors_total", [])}
    rows = sorted((labels.get("op", ""), v) for labels, v in samples.get(
        "floe_object_store_requests_total", []))
    if not rows:
        return []
    out = ["<h2>Object store requests</h2><table><tr><th class='l'>op</th><th>requests</th>"
           "<th>errors</th></tr>"]
    for op, n in rows:
        err = errors.get(op, 0.0)
        out.append(f"<tr><td class='l'>{e(op)}</td><td>{n:.0f}</td>"
                   f"<td class='{'bad' if err else ''}'>{err:.0f}</td></tr>")
    out.append("</table>")
    return out


def _groups(samples: Samples) -> list[str]:
    committed = {(d["group"], d["topic"], d["partition"]): v
                 for d, v in samples.get("floe_group_committed_offset", [])}
    lags = sorted(((d["group"], d["topic"], d["partition"]), v)
                  for d, v in samples.get("floe_group_lag_records", []))
    out = [f"<h2>Consumer groups ({len({k[0] for k, _ in lags})})</h2>"]
    if not lags:
        return [*out, "<p class='muted'>no committed offsets</p>"]
    out.append("<table><tr><th class='l'>group</th><th class='l'>topic</th><th>partition</th>"
               "<th>committed</th><th>lag (records)</th></tr>")
    for (g, t, p), lag in lags:
        out.append(f"<tr><td class='l'>{e(g)}</td><td class='l'>{e(t)}</td><td>{e(p)}</td>"
                   f"<td>{committed.get((g, t, p), 0):.0f}</td>"
                   f"<td id='group-lag-{e(g)}-{e(t)}-{e(p)}'>{lag:.0f}</td></tr>")
    out.append("</table>")
    return out


def _at(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _health(health: dict[str, Any]) -> list[str]:
    ok = health.get("healthy", False)
    out = [f"<h2>Health: <span class='{'ok' if ok else 'bad'}' id='healthy'>"
           f"{'healthy' if ok else 'UNHEALTHY'}</span></h2>",
           "<table><tr><th class='l'>component</th><th class='l'>target</th><th>state</th>"
           "<th class='l'>last error</th></tr>"]
    for name, c in sorted(health.get("components", {}).items()):
        err = f"{c['last_error']} ({_at(c['last_error_at'])})" if c.get("last_error") else ""
        state = "<span class='ok'>ok</span>" if c["ok"] else "<span class='bad'>down</span>"
        out.append(f"<tr><td class='l'>{e(name)}</td><td class='l'>{e(c['target'])}</td>"
                   f"<td>{state}</td><td class='l'>{e(err)}</td></tr>")
    out.append("</table>")
    return out


def _table(t: dict[str, Any], lineage: dict[str, Any] | None, now: float) -> list[str]:
    topic = t["topic"]
    stopped = [p for p in t["partitions"] if p.get("stopped")]
    state = (f"PAUSED: {t['paused']}" if t.get("paused") else
             "STOPPED (errors.tolerance=none)" if stopped else
             "FAILING" if t["last_error"] else "running")
    cls = "ok" if state == "running" else "bad"
    last = f"{now - t['last_commit']:.1f} s ago" if t["last_commit"] else "never"
    fresh = t.get("freshness", {})
    took = fresh.get("last_commit_seconds")
    out = [
        f"<h3>{e(topic)} &rarr; {e(t['table'])} <span class='muted'>({e(t['value_type'])})"
        "</span></h3>",
        f"<p>writer: <span class='{cls}' id='state-{e(topic)}'>{e(state)}</span> &middot; "
        f"{e(t['commits'])} commits, {e(t['rows'])} rows, last commit {e(last)}"
        + (f" (took {e(took)} s)" if took is not None else "")
        + f" &middot; dead letters: <span id='dlq-{e(topic)}'>{e(t['dead_letters'])}</span> "
        f"in {e(t['dlq_topic'])} &middot; retries {e(t.get('retries', {}))}</p>",
    ]
    if t["last_error"]:
        out.append(f"<p class='bad'>last error: {e(t['last_error'])}</p>")
    out += cluster.table_costs(topic, t.get("costs", {}))
    out.append("<table><tr><th>partition</th><th>log end</th><th>converted</th>"
               "<th>committed</th><th>lag (records)</th><th>ack&rarr;converted s</th>"
               "<th>ack&rarr;committed s</th><th class='l'>stopped</th></tr>")
    by_part = {f["partition"]: f for f in fresh.get("partitions", [])}
    for p in t["partitions"]:
        n, f = p["partition"], by_part.get(p["partition"], {})
        pid = f"{e(topic)}-{n}"
        out.append(
            f"<tr><td>{n}</td><td>{p['log_end_offset']}</td>"
            f"<td>{e(f.get('converted_offset', ''))}</td><td>{p['committed_offset']}</td>"
            f"<td id='lag-{pid}'>{p['lag_records']}</td>"
            f"<td>{e(f.get('ack_to_converted_seconds', ''))}</td>"
            f"<td id='lag-seconds-{pid}'>{p['lag_seconds']}</td>"
            f"<td class='l'>{e(p.get('stopped') or '')}</td></tr>")
    out.append("</table>")
    out += _snapshots(topic, lineage)
    return out


def _snapshots(topic: str, lineage: dict[str, Any] | None) -> list[str]:
    link = f"<a href='/tables/{e(topic)}/lineage'>lineage (JSON)</a>"
    if lineage is None or "snapshots" not in lineage:
        why = (lineage or {}).get("error", "not available")
        return [f"<p class='muted'>snapshots: {e(why)} &middot; {link}</p>"]
    snaps = lineage["snapshots"][-SNAPSHOTS_SHOWN:]
    out = [f"<p>latest {len(snaps)} of {len(lineage['snapshots'])} snapshots &middot; {link}</p>",
           "<table><tr><th class='l'>snapshot</th><th class='l'>time (UTC)</th>"
           "<th class='l'>operation</th><th>+rows</th><th>-rows</th><th>rows</th>"
           "<th class='l'>offsets [from, to) per partition</th></tr>"]
    for s in reversed(snaps):
        mark = " (current)" if s["current"] else " (rolled back)" if s["rolled_back"] else ""
        ranges = " ".join(f"p{p}:[{'start' if a is None else a},{b})"
                          for p, (a, b) in s["ranges"].items())
        out.append(
            f"<tr><td class='l'>{s['snapshot_id']}{mark}</td>"
            f"<td class='l'>{_at(s['timestamp_ms'] / 1000)}</td><td class='l'>"
            f"{e(s['operation'])}</td><td>{s['added_records']}</td><td>{s['deleted_records']}"
            f"</td><td>{s['total_records']}</td><td class='l'>{e(ranges)}</td></tr>")
    out.append("</table>")
    return out
