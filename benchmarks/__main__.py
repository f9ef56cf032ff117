"""python -m benchmarks run [--quick] --out DIR      run everything, write results + report
python -m benchmarks compare A/results.json B/results.json   figure by figure, B against A
python -m benchmarks summary DIR/results.json     floe's figures as one markdown table
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from benchmarks.workloads import table_plan, workloads


def _run(args: argparse.Namespace) -> int:
    from benchmarks import plots, report
    from benchmarks.runner import Options, Run

    out = Path(args.out)
    opts = Options(
        out=out,
        quick=args.quick,
        tansu=args.tansu,
        skip_tansu=args.skip_tansu,
        skip_s3=args.skip_s3,
        keep_data=args.keep_data,
        floe_root=Path(args.floe_root).resolve() if args.floe_root else None,
    )
    results = Run(opts).run()
    try:
        paths = plots.all_plots(results.series, out)
    except ImportError as e:
        results.error("plots", "all", f"matplotlib missing ({e}); install the bench extra")
        paths = []
    results.write(out / "results.json")
    plan = table_plan(args.quick)
    lines = [f"- `{w.name}`: {w.describe()}" for w in workloads(args.quick)]
    lines.append(
        f"- `table`: JSON at {plan.rate:,.0f} records/s x {plan.size} B into a table topic "
        f"with {plan.partitions} partitions for {plan.duration:g} s (commit.interval.ms=1000); "
        f"then {plan.backlog_s:g} s of JSON at max rate with the table off, switched on afterwards"
    )
    (out / "report.md").write_text(report.render(results, paths, lines) + "\n")
    print("\n".join(report.headline(results)))
    print(f"wrote {out / 'results.json'}, {out / 'report.md'} and {len(paths)} plots")
    return 0


def _compare(args: argparse.Namespace) -> int:
    a = json.loads(Path(args.a).read_text())
    b = json.loads(Path(args.b).read_text())
    old = {f["name"]: f for f in a["figures"]}
    print(f"A: {a['git'].get('commit', '?')[:12]}  B: {b['git'].get('commit', '?')[:12]}")
    print(f"{'figure':<56} {'A':>12} {'B':>12} {'change':>8}")
    for f in b["figures"]:
        prev = old.get(f["name"])
        va, vb = (prev or {}).get("value"), f.get("value")
        change = ""
        if va and vb is not None:
            pct = (vb - va) / va * 100
            better = pct > 0 if f.get("higher_is_better", True) else pct < 0
            change = f"{pct:+.0f}%" + (" +" if better and abs(pct) >= 5 else "")
        fa = "—" if va is None else f"{va:.4g}"
        fb = "—" if vb is None else f"{vb:.4g}"
        print(f"{f['name']:<56} {fa:>12} {fb:>12} {change:>8}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the benchmark suite")
    r.add_argument("--quick", action="store_true", help="short runs (under two minutes)")
    r.add_argument("--out", required=True, help="directory for results.json, report.md, PNGs")
    r.add_argument("--tansu", help="path to a tansu binary (default: see benchmarks/tansu.py)")
    r.add_argument("--skip-tansu", action="store_true")
    r.add_argument("--skip-s3", action="store_true", help="no moto, no S3 runs")
    r.add_argument("--keep-data", action="store_true", help="keep the brokers' data dirs")
    r.add_argument(
        "--floe-root",
        help="measure the broker of another checkout (e.g. a git worktree of an older commit)",
    )
    s = sub.add_parser("summary", help="print a results.json's floe figures as a markdown table")
    s.add_argument("results")
    c = sub.add_parser("compare", help="compare two results.json files figure by figure")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every process the run started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.command == "run":
        return _run(args)
    if args.command == "summary":
        from benchmarks import report
        from benchmarks.results import Results

        print("\n".join(report.headline(Results.load(Path(args.results)), everything=True)))
        return 0
    try:
        return _compare(args)
    except BrokenPipeError:  # e.g. piped into head
        return 0


if __name__ == "__main__":
    sys.exit(main())
