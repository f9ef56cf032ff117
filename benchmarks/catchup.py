"""The S3 catch-up read alone, for profiling: moto, a floe-s3 broker, max-rate produce of the
catch-up workload, a broker restart, a cold read from offset 0, and the raw sequential GET of
the same objects in the same run (the ceiling the full run divides by).

`.venv/bin/python -m benchmarks.catchup [--seconds 8] [--profile DIR [--gil]] [--file]
[--floe-root DIR]`

Prints catch-up MiB/s, its ratio to raw GET, the longest wait between records at the consumer,
the broker's CPU seconds per GiB read and its peak RSS; with `--profile`, `py-spy record`
samples the broker during the read (DIR/catchup.svg flame graph and DIR/catchup.txt top
frames; `--gil`: only the thread holding the GIL). The machine is
shared: compare ratios from one run, not absolute figures between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks import ceilings
from benchmarks.drive import consume_all, create_topic, produce
from benchmarks.motoproc import MOTO_ENV
from benchmarks.procs import Processes
from benchmarks.systems import FLOE_FILE, FLOE_S3, System, start_moto
from benchmarks.workloads import CATCHUP_WORKLOAD, Workload, workloads


def _workload(seconds: float) -> Workload:
    w = next(w for w in workloads(False) if w.name == CATCHUP_WORKLOAD)
    return Workload(w.name, w.size, w.partitions, 0, seconds, flush_timeout=30)


def _py_spy(pid: int, out: Path, fmt: str, gil: bool = False) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).with_name("py-spy")
    cmd = [str(spy), "record", "--pid", str(pid), "--rate", "200", "--format", fmt]
    cmd += ["--gil"] if gil else []
    cmd += ["--output", str(out), "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_frames(raw: Path, n: int = 25) -> list[str]:
    """Self and total sample shares per function of a py-spy `raw` (collapsed stacks) file."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        k = int(count)
        frames = stack.split(";")
        samples += k
        own[frames[-1]] = own.get(frames[-1], 0) + k
        for f in set(frames):
            total[f] = total.get(f, 0) + k
    rows = sorted(own.items(), key=lambda e: -e[1])[:n]
    return [
        f"{100 * k / samples:5.1f}% self {100 * total[f] / samples:5.1f}% total  {f}"
        for f, k in rows
    ]


def _store_requests(address: str | None) -> dict[str, float]:
    """The broker's object-store requests by operation since it started (its /metrics)."""
    if not address:
        return {}
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("floe_object_store_requests_total{"):
            labels, _, value = line.rpartition(" ")
            out[labels.split('op="')[1].split('"')[0]] = float(value)
        elif line.startswith(("floe_cache_hits_total", "floe_cache_misses_total")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def run(
    seconds: float,
    profile: Path | None,
    system_name: str,
    floe_root: Path | None = None,
    gil: bool = False,
) -> dict[str, Any]:
    w = _workload(seconds)
    os.environ.update(MOTO_ENV)  # the raw GET ceiling's own client
    work = Path(tempfile.mkdtemp(prefix="floe-catchup-"))
    with Processes(work / "logs") as procs:
        moto = start_moto(procs) if system_name == FLOE_S3 else None
        system = System(
            system_name,
            procs,
            work / "data",
            moto=moto,
            bucket="catchup",
            metrics=True,
            floe_root=floe_root,
        )
        system.start()
        topic = f"bench-{w.name}"
        create_topic(system.bootstrap, topic, w.partitions)
        r = produce(procs, system, w, topic, work, tail_consumer=False)
        acked = int(r.produce.get("acked", 0))
        wal_sizes = system.list_wal_sizes()
        system.restart()
        spies = []
        if profile is not None and system.proc is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spies = [
                _py_spy(system.proc.pid, profile / "catchup.svg", "flamegraph", gil),
                _py_spy(system.proc.pid, profile / "catchup.raw", "raw", gil),
            ]
        read, cpu = consume_all(
            procs, system, topic, w.partitions, acked, work, "catchup", 120.0
        )
        requests = _store_requests(system.metrics_address)
        after = system.sample()
        system.stop()
        for s in spies:
            s.wait(30)
        raw = ceilings.raw_object_store(system.object_store_url, wal_sizes, budget_s=8.0)
    shutil.rmtree(work / "data", ignore_errors=True)  # gigabytes; the logs stay
    mib = read.get("bytes", 0) / 2**20
    out = {
        "acked": acked,
        "records": read.get("records"),
        "catchup_mib_s": read.get("mib_s"),
        "raw_get_mib_s": raw.get_mib_s,
        "ratio": (read.get("mib_s") or 0) / raw.get_mib_s if raw.get_mib_s else None,
        "max_gap_s": read.get("max_gap_s"),
        "broker_cpu_s_per_gib": cpu / (mib / 1024) if mib else None,
        "store_requests": requests,
        "peak_rss_mib": after.peak_rss_bytes / 2**20 if after is not None else None,
        "error": read.get("error") or raw.error,
    }
    if profile is not None and (profile / "catchup.raw").exists():
        lines = top_frames(profile / "catchup.raw")
        (profile / "catchup.txt").write_text("\n".join(lines) + "\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.catchup")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of max-rate produce")
    ap.add_argument("--profile", help="directory for py-spy's flame graph and top frames")
    ap.add_argument("--file", action="store_true", help="the local-directory store, not moto")
    ap.add_argument("--floe-root", help="measure the broker of another checkout")
    ap.add_argument("--gil", action="store_true",
                    help="profile only the thread holding the GIL (the broker's Python CPU)")
    args = ap.parse_args()
    prof = Path(args.profile) if args.profile else None
    root = Path(args.floe_root).resolve() if args.floe_root else None
    out = run(args.seconds, prof, FLOE_FILE if args.file else FLOE_S3, root, args.gil)
    print(json.dumps(out, indent=1))
    if prof is not None and (prof / "catchup.txt").exists():
        print((prof / "catchup.txt").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
