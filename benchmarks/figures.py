"""Turning client results into figures, and putting ceilings and Tansu next to them."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.drive import RunResult
from benchmarks.results import Results
from benchmarks.stats import percentile
from benchmarks.systems import FLOE_FILE, FLOE_S3, NULL, PEER
from benchmarks.workloads import Workload
from s3stream.wal import WalSettings

GIB = 2**30
SPECTRUM = (0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99)  # percentiles for plots
RAW = {FLOE_FILE: "raw-file", FLOE_S3: "raw-s3"}
# the brokers run with the default wal.flush.interval.ms: issue 17's S3 fixed-rate bound is
# 2 x the store's PUT p99 + this
FLUSH_INTERVAL_MS = WalSettings().flush_interval_ms


def _ms(ns: float) -> float:
    return ns / 1e6


def add_run(results: Results, w: Workload, r: RunResult) -> None:
    """Figures of one workload on one system (and plot series)."""
    p, c = r.produce, r.consume
    err = r.error or p.get("first_error", "")
    if p.get("errors"):
        err = f"{p['errors']} of {p.get('sent')} records failed: {p.get('first_error')}"
    ok = bool(p.get("acked")) and not p.get("errors")
    val = (lambda x: x) if ok else (lambda x: None)
    results.add(r.system, w.name, "produce_mib_s", val(p.get("mib_s")), "MiB/s", error=err)
    results.add(r.system, w.name, "produce_rec_s", val(p.get("rec_s")), "records/s", error=err)
    if not w.fixed and ok:
        gib = p["acked"] * w.size / GIB
        results.add(
            r.system, w.name, "broker_cpu_s_per_gib", r.broker_cpu_s / gib, "CPU s/GiB", False
        )
    series = results.series.setdefault("timeline", {}).setdefault(w.name, {})
    series[r.system] = p.get("timeline", [])
    lat: list[float] = p.get("latency_ns", []) if ok else []
    if w.fixed:
        # records never acknowledged count as infinitely late (no coordinated omission)
        missing = max(0, int(p.get("scheduled", 0)) - int(p.get("acked", 0)))
        if missing and not err:
            err = (
                f"did not sustain {w.rate:,.0f} records/s: {p.get('acked', 0):,} of "
                f"{p.get('scheduled', 0):,} acknowledged within the run + {w.flush_timeout:g} s"
            )
        lat = lat + [math.inf] * missing
        for q in (50, 99, 99.9):
            v = _ms(percentile(lat, q)) if lat else None
            v = v if v is not None and math.isfinite(v) else None
            results.add(r.system, w.name, f"produce_p{q:g}_ms", v, "ms", False, error=err)
        spectra = results.series.setdefault("latency", {}).setdefault(w.name, {})
        if lat and not missing:
            spectra[f"{r.system} produce"] = [(q, _ms(percentile(lat, q))) for q in SPECTRUM]
        if r.system != NULL:
            e2e: list[int] = c.get("latency_ns", [])
            cerr = c.get("error", "") or c.get("first_error", "")
            if missing:
                cerr = cerr or f"the producer did not sustain the rate ({err})"
            if c and c.get("records", 0) < p.get("acked", 0):
                cerr = cerr or f"consumer read {c.get('records')} of {p.get('acked')} records"
            for q in (50, 99):
                v = _ms(percentile(e2e, q)) if e2e and not cerr else None
                results.add(r.system, w.name, f"e2e_p{q:g}_ms", v, "ms", False, error=cerr)
            if e2e and not cerr:
                spectra[f"{r.system} end-to-end"] = [(q, _ms(percentile(e2e, q))) for q in SPECTRUM]


def add_read(
    results: Results, system: str, workload: str, metric: str, read: dict[str, Any], expect: int
) -> None:
    err = read.get("error", "") or read.get("first_error", "")
    note = ""
    if not err and not read.get("records"):
        err = f"read nothing of {expect:,} records"
    elif read.get("records", 0) < expect:
        note = f"stopped early: read {read.get('records', 0):,} of {expect:,} records"
    if read.get("max_gap_s", 0) > 1.0:
        gap = f"longest wait between records {read['max_gap_s']:.1f} s"
        note = f"{note}; {gap}" if note else gap
    value = None if err else read.get("mib_s")
    results.add(system, workload, metric, value, "MiB/s", note=note, error=err)


def _put_bound(results: Results, workload: str) -> float | None:
    """2 x the S3 store's sequential PUT p99 of this workload's WAL objects + the flush
    interval (None without that PUT figure)."""
    p99 = results.value("raw-s3", workload, "put_p99_ms")
    return None if p99 is None else 2 * p99 + FLUSH_INTERVAL_MS


def apply_ceilings(results: Results) -> None:
    """Ceiling and ratio for every figure that has one; Tansu next to ours."""
    conv = results.value("in-process", "table", "parquet_rows_s")
    for f in results.figures:
        if f.system in (NULL, "raw-file", "raw-s3") or f.value is None:
            continue
        m, w = f.metric, f.workload
        null = results.value(NULL, w, m)
        raw = RAW.get(f.system)
        if m in ("produce_mib_s", "produce_rec_s") and not w.startswith("fixed"):
            options = [(null, "null broker")]
            put = results.value(raw, "raw", "put_mib_s") if raw else None
            if put is not None:
                size = 1024 if "-1k-" in w else 100
                scale = 1.0 if m == "produce_mib_s" else 2**20 / size
                options.append((put * scale, f"raw sequential PUT ({raw})"))
            known = [(v, s) for v, s in options if v is not None]
            if known:
                f.set_ceiling(*min(known))
        elif m == "produce_p99_ms" and f.system == FLOE_S3 and (bound := _put_bound(results, w)):
            f.set_ceiling(bound, f"2x raw PUT p99 ({raw}) + {FLUSH_INTERVAL_MS:g} ms flush"
                                 " interval (issue 17's bound)")
        elif m.startswith("produce_p") or m == "broker_cpu_s_per_gib":
            f.set_ceiling(null, "null broker (floor)")
        elif m in ("catchup_mib_s", "consume_mib_s") and raw:
            f.set_ceiling(results.value(raw, "raw", "get_mib_s"), f"raw sequential GET ({raw})")
        elif m in ("backlog_rows_s", "convert_rows_s", "native_rows_s",
                   "convert_and_write_rows_s"):
            f.set_ceiling(conv, "pyarrow write_table (zstd), same rows")
        peer = PEER.get(f.system)
        if peer is not None:
            f.set_tansu(results.get(peer, w, m))
