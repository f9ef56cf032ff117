"""PNG plots of a run: produce throughput over time, latency percentiles, table freshness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    "null": "#999999",
    "floe-file": "#1f77b4",
    "tansu-memory": "#ff7f0e",
    "floe-s3": "#2ca02c",
    "tansu-s3": "#d62728",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput(series: dict[str, dict[str, list[list[float]]]], out: Path) -> list[Path]:
    """One PNG per workload: acknowledged MiB/s per 250 ms, one line per system."""
    plt = _plt()
    paths = []
    for workload, systems in series.items():
        fig, ax = plt.subplots(figsize=(8, 4))
        for system, points in systems.items():
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=system, color=COLORS.get(system), linewidth=1.2)
        ax.set_title(f"{workload}: produce throughput (acknowledged, 250 ms buckets)")
        ax.set_xlabel("seconds since the first send")
        ax.set_ylabel("MiB/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out / f"throughput-{workload}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def latency(series: dict[str, dict[str, list[list[float]]]], out: Path) -> list[Path]:
    """One PNG per fixed-rate workload: latency by percentile (log scales), produce latency
    (from the intended send time) on the left, end-to-end on the right."""
    plt = _plt()
    ticks = [0, 50, 90, 99, 99.9, 99.99]
    paths = []
    for workload, lines in series.items():
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
        for ax, kind, title in (
            (axes[0], "produce", "produce (ack - intended send time)"),
            (axes[1], "end-to-end", "end-to-end (receive - intended send time)"),
        ):
            for label, points in lines.items():
                if not label.endswith(kind) or not points:
                    continue
                system = label.split()[0]
                xs = [1 / (1 - min(q, 99.999) / 100) for q, _v in points]
                ys = [max(v, 1e-3) for _q, v in points]
                ax.plot(xs, ys, marker="o", markersize=3, label=system, color=COLORS.get(system))
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks([1 / (1 - q / 100) for q in ticks], [f"p{q:g}" for q in ticks])
            ax.set_title(f"{workload}: {title}", fontsize=9)
            ax.set_xlabel("percentile")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
        axes[0].set_ylabel("ms")
        path = out / f"latency-{workload}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def freshness(samples: list[float], out: Path) -> list[Path]:
    if not samples:
        return []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.hist(samples, bins=50, color=COLORS["floe-file"])
    ax.set_title("table topic: acknowledged -> visible in the Iceberg table (commit.interval 1 s)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("records")
    ax.grid(alpha=0.3)
    path = out / "table-freshness.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def all_plots(series: dict[str, Any], out: Path) -> list[Path]:
    paths = throughput(series.get("timeline", {}), out)
    paths += latency(series.get("latency", {}), out)
    paths += freshness(series.get("freshness", []), out)
    return paths
