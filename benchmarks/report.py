"""report.md: every figure next to its ceiling and its Tansu counterpart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.results import Figure, Results
from benchmarks.systems import FLOE_FILE, FLOE_S3, NULL, PEER


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _why(f: Figure) -> str:
    text = (f.error or f.note).replace("\n", " ").replace("|", "/")
    return text[:160] + ("…" if len(text) > 160 else "")


def _share(v: float | None) -> str:
    return "?" if v is None else f"{v * 100:.0f}%"


def _busy(m: dict[str, Any]) -> bool:
    share = m.get("other_cpu_share")
    return share is not None and share > 0.1


def system_table(results: Results, system: str) -> list[str]:
    peer = PEER.get(system, "")
    rows = [
        f"| workload | figure | {system} | ceiling | {system}/ceiling | {peer} | "
        f"{system}/{peer} | notes |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for f in results.figures:
        if f.system != system:
            continue
        ceiling = f"{fmt(f.ceiling)} ({f.ceiling_source})" if f.ceiling is not None else "—"
        value = f"{fmt(f.value)} {f.unit}" if f.value is not None else "**failed**"
        rows.append(
            f"| {f.workload} | {f.metric} | {value} | {ceiling} | {ratio(f.ratio)} | "
            f"{fmt(f.tansu)} | {ratio(f.vs_tansu)} | {_why(f)} |"
        )
    return rows


def plain_table(results: Results, systems: tuple[str, ...]) -> list[str]:
    rows = ["| system | workload | figure | value | notes |", "|---|---|---|---:|---|"]
    for f in results.figures:
        if f.system in systems:
            value = f"{fmt(f.value)} {f.unit}" if f.value is not None else "**failed**"
            rows.append(f"| {f.system} | {f.workload} | {f.metric} | {value} | {_why(f)} |")
    return rows


def headline(results: Results, everything: bool = False) -> list[str]:
    """The few figures a reader wants first; with `everything`, every floe figure."""
    want = [
        (FLOE_FILE, "max-1k-16p", "produce_mib_s"),
        (FLOE_FILE, "max-1k-16p", "consume_mib_s"),
        (FLOE_FILE, "fixed-1k-16p", "produce_p99_ms"),
        (FLOE_FILE, "fixed-1k-16p", "e2e_p99_ms"),
        (FLOE_FILE, "catchup", "catchup_mib_s"),
        (FLOE_FILE, "max-1k-16p", "broker_cpu_s_per_gib"),
        (FLOE_S3, "max-1k-16p", "produce_mib_s"),
        (FLOE_S3, "catchup", "catchup_mib_s"),
        (FLOE_FILE, "table", "freshness_p99_s"),
        (FLOE_FILE, "table", "backlog_rows_s"),
    ]
    if everything:
        keep = (FLOE_FILE, FLOE_S3, "in-process")
        want = [(f.system, f.workload, f.metric) for f in results.figures if f.system in keep]
    rows = [
        "| system | workload | figure | value | ceiling | ratio | Tansu | floe/Tansu |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for system, workload, metric in want:
        f = results.get(system, workload, metric)
        if f is None:
            continue
        value = f"{fmt(f.value)} {f.unit}" if f.value is not None else "failed"
        rows.append(
            f"| {system} | {workload} | {metric} | {value} | {fmt(f.ceiling)} | "
            f"{ratio(f.ratio)} | {fmt(f.tansu)} | {ratio(f.vs_tansu)} |"
        )
    return rows


def render(results: Results, plots: list[Path], workload_lines: list[str]) -> str:
    m: dict[str, Any] = results.machine
    g: dict[str, Any] = results.git
    libs = ", ".join(f"{k} {v}" for k, v in m.get("libraries", {}).items())
    out = [
        f"# floe benchmark ({'quick' if results.quick else 'full'} run)",
        "",
        f"- started {results.started}, took {results.duration_s:.0f} s",
        f"- commit `{g.get('commit', '?')[:12]}` ({g.get('subject', '')}); "
        f"{g.get('dirty_files', 0)} files differ from it",
        f"- machine: {m.get('cores')} cores ({m.get('cpu')}), {m.get('memory_gib')} GiB, "
        f"Python {m.get('python')}, {m.get('platform')}",
        f"- libraries: {libs}; peer: {m.get('tansu') or 'none'}",
        "- broker, clients, moto and Tansu share these cores; every figure and its ceiling "
        "come from this run.",
        f"- other processes on the machine took {_share(m.get('other_cpu_share'))} of its CPU "
        f"during the run (load average {m.get('loadavg_at_start', 0):.1f} at the start)"
        + (" — **a busy machine: figures are low and noisy**" if _busy(m) else ""),
        "",
        "Ratios are figure / ceiling and floe / Tansu. For throughput higher is better "
        "(ratio < 1: below the ceiling); for latency, CPU and memory lower is better "
        "(the null broker's figure is a floor, ratio > 1: slower than it).",
        "",
        "## Workloads",
        "",
        *workload_lines,
        "",
        "## Headline",
        "",
        *headline(results),
        "",
    ]
    for system in (FLOE_FILE, FLOE_S3):
        out += [f"## {system} vs {PEER[system]}", "", *system_table(results, system), ""]
    out += [
        "## Ceilings and peers (raw figures)",
        "",
        *plain_table(results, (NULL, "raw-file", "raw-s3", "in-process", *PEER.values())),
        "",
    ]
    if results.errors:
        out += ["## What failed", ""]
        for e in results.errors:
            out += [f"- **{e['system']} / {e['workload']}**:", "", "```", e["error"], "```"]
        out.append("")
    if plots:
        out += ["## Plots", ""]
        out += [f"![{p.stem}]({p.name})" for p in plots]
        out.append("")
    return "\n".join(out)
