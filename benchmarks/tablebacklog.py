"""The table backlog alone, for profiling: a floe-file broker, JSON records produced at max
rate into a topic whose table is off, then the table switched on; the writer's catch-up
rows/s as in the full run (benchmarks.tablebench, `backlog_rows_s`), the rows the table held
over time after the switch, and the broker's CPU seconds during the catch-up.

`.venv/bin/python -m benchmarks.tablebacklog [--seconds 3] [--partitions 4] [--profile DIR]
[--floe-root DIR] [--runs N] [--config KEY=VALUE] [--cold]`

As in the full run, where the steady table run comes first, another table topic is switched on
before (the broker has loaded the table stack: pyarrow, ~0.3-0.5 s on 2 vCPUs); `--cold`
leaves that out, the import then counts in the catch-up.

With `--profile`, `py-spy record` samples the broker (its threads too) from the switch until
the table holds every row: DIR/backlog.json (speedscope) and DIR/backlog.txt (top frames).
The machine is shared: compare figures measured back to back (`--floe-root` runs another
checkout's broker; `--runs` alternates nothing, it repeats), not between runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.catchup import top_frames
from benchmarks.drive import create_topic
from benchmarks.procs import Processes
from benchmarks.procstat import cpu_seconds
from benchmarks.systems import FLOE_FILE, System
from benchmarks.tablebench import TABLE_CONFIGS, TableRun, _backlog, wait_for_table
from benchmarks.workloads import TablePlan, table_plan


def _py_spy(pid: int, out: Path, fmt: str) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).with_name("py-spy")
    cmd = [str(spy), "record", "--pid", str(pid), "--rate", "200", "--format", fmt,
           "--threads", "--output", str(out), "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(seconds: float, partitions: int, profile: Path | None,
        floe_root: Path | None = None, configs: dict[str, str] | None = None,
        cold: bool = False) -> dict[str, Any]:
    quick = table_plan(True)
    plan = TablePlan(rate=quick.rate, duration=quick.duration, partitions=partitions,
                     size=quick.size, backlog_s=seconds, convert_rows=0)
    work = Path(tempfile.mkdtemp(prefix="floe-tablebacklog-"))
    res = TableRun()
    spies: list[subprocess.Popen[bytes]] = []
    cpu: list[float] = []
    peak = 0
    with Processes(work / "logs") as procs:
        system = System(FLOE_FILE, procs, work / "data", metrics=True, floe_root=floe_root)
        system.start()
        assert system.proc is not None
        pid = system.proc.pid
        address = system.metrics_address
        assert address is not None
        if not cold:  # the table stack loaded, as after the full run's steady table run
            create_topic(system.bootstrap, "table-warm", 1, TABLE_CONFIGS)
            if not wait_for_table(address, "table-warm"):
                raise RuntimeError("the warm-up table topic's writer did not start")

        def switch() -> None:
            cpu.append(cpu_seconds(pid))
            if profile is not None:
                profile.mkdir(parents=True, exist_ok=True)
                spies.append(_py_spy(pid, profile / "backlog.json", "speedscope"))
                spies.append(_py_spy(pid, profile / "backlog.raw", "raw"))

        try:
            _backlog(procs, system, plan, work, address, res, on_switch=switch,
                     extra_configs=configs)
            cpu.append(cpu_seconds(pid))
            peak = system.peak_rss_bytes
        finally:
            system.stop()
            for s in spies:
                s.wait(30)
            shutil.rmtree(work / "data", ignore_errors=True)  # the logs stay
    out: dict[str, Any] = {
        "backlog_rows": res.backlog_rows,
        "backlog_rows_s": round(res.backlog_rows_s),
        "catch_up_s": round(res.backlog_rows / res.backlog_rows_s, 2)
        if res.backlog_rows_s else None,
        "broker_cpu_s": round(cpu[1] - cpu[0], 2) if len(cpu) == 2 else None,
        "peak_rss_mib": round(peak / 2**20) if peak else None,
        "rows_over_time": _steps(res.backlog_samples),
        "error": res.error,
    }
    if profile is not None and (profile / "backlog.raw").exists():
        lines = top_frames(profile / "backlog.raw", 40)
        (profile / "backlog.txt").write_text("\n".join(lines) + "\n")
    return out


def _steps(samples: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The samples where the row count changed (and the first)."""
    out: list[tuple[float, int]] = []
    for t, rows in samples:
        if not out or rows != out[-1][1]:
            out.append((t, rows))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tablebacklog")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of max-rate produce")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--profile", help="directory for py-spy's profile and top frames")
    ap.add_argument("--floe-root", help="measure the broker of another checkout")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--cold", action="store_true",
                    help="no table topic before: the table stack's import counts")
    ap.add_argument("--config", action="append", default=[],
                    help="KEY=VALUE: another topic config (e.g. table.topic.commit.interval.ms)")
    args = ap.parse_args()
    prof = Path(args.profile) if args.profile else None
    root = Path(args.floe_root).resolve() if args.floe_root else None
    for _ in range(args.runs):
        configs = dict(c.split("=", 1) for c in args.config)
        out = run(args.seconds, args.partitions, prof, root, configs, args.cold)
        print(json.dumps(out))
    if prof is not None and (prof / "backlog.txt").exists():
        print((prof / "backlog.txt").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
