"""One benchmark run: every system in turn, then the table topic and in-process ceilings."""

from __future__ import annotations

import datetime
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks import ceilings, tablebench
from benchmarks.drive import consume_all, create_topic, produce
from benchmarks.figures import RAW, add_read, add_run, apply_ceilings
from benchmarks.motoproc import MOTO_ENV, empty_bucket
from benchmarks.procs import Processes
from benchmarks.procstat import LoadMeter
from benchmarks.results import Results, git_info, machine_info
from benchmarks.systems import (
    DURABLE_AFTER_RESTART,
    FLOE_FILE,
    FLOE_S3,
    NULL,
    TANSU_MEMORY,
    TANSU_S3,
    Moto,
    System,
    start_moto,
)
from benchmarks.tansu import TansuNotFound, find_tansu, tansu_version
from benchmarks.workloads import CATCHUP_WORKLOAD, Workload, table_plan, workloads

ROOT = Path(__file__).resolve().parent.parent


def read_timeout(records: int, size: int) -> float:
    """Time allowed to read a topic back: at least 10 MiB/s, 15 to 90 s."""
    return min(90.0, max(15.0, records * size / 2**20 / 10))


@dataclass
class Options:
    out: Path
    quick: bool = False
    tansu: str | None = None
    skip_tansu: bool = False
    skip_s3: bool = False
    keep_data: bool = False
    floe_root: Path | None = None  # the checkout whose broker is measured (default: this one)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Run:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.out = opts.out
        self.work = opts.out / "work"
        self.raw_dir = opts.out / "raw"
        self.results = Results(
            quick=opts.quick, started=datetime.datetime.now(datetime.UTC).isoformat()
        )
        self.workloads = workloads(opts.quick)
        self.tansu: Path | None = None
        self.tansu_error = ""

    def run(self) -> Results:
        t0 = time.monotonic()
        load = LoadMeter()
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        self._find_tansu()
        self.results.git = git_info(self.opts.floe_root or ROOT)
        if self.opts.floe_root is not None:
            self.results.git["benchmark_code"] = git_info(ROOT)["commit"]
        self.results.machine = machine_info(tansu_version(self.tansu) if self.tansu else "")
        self.results.machine["loadavg_at_start"] = os.getloadavg()[0]
        with Processes(self.out / "logs") as procs:
            for name in (NULL, FLOE_FILE, TANSU_MEMORY):
                self._system(procs, name, None)
            self._table(procs)
            if not self.opts.skip_s3:
                moto = None
                try:
                    moto = start_moto(procs)
                except RuntimeError as e:
                    self.results.error("moto", "start", str(e))
                if moto is not None:
                    os.environ.update(MOTO_ENV)  # the raw S3 ceiling runs in this process
                    for name in (FLOE_S3, TANSU_S3):
                        self._system(procs, name, moto)
                    procs.stop(moto.proc)
        self._conversion()
        apply_ceilings(self.results)
        self._figure_errors()
        if not self.opts.keep_data:
            shutil.rmtree(self.work, ignore_errors=True)
        self.results.duration_s = time.monotonic() - t0
        other = load.other_share()
        self.results.machine["loadavg_at_end"] = os.getloadavg()[0]
        if other is not None:
            self.results.machine["other_cpu_share"] = round(other, 3)
        return self.results

    def _figure_errors(self) -> None:
        """Every figure that failed is also listed under errors (once per distinct reason)."""
        seen = {(e["system"], e["workload"], e["error"]) for e in self.results.errors}
        for f in self.results.figures:
            key = (f.system, f.workload, f.error)
            if f.error and not any(k[:2] == key[:2] and _overlap(f.error, k[2]) for k in seen):
                self.results.error(f.system, f.workload, f.error)
                seen.add(key)

    def _find_tansu(self) -> None:
        if self.opts.skip_tansu:
            self.tansu_error = "skipped (--skip-tansu)"
            return
        try:
            self.tansu = find_tansu(self.opts.tansu)
        except TansuNotFound as e:
            self.tansu_error = str(e)
            self.results.error("tansu", "all", self.tansu_error)

    # -- one system ------------------------------------------------------------------------
    def _system(self, procs: Processes, name: str, moto: Moto | None) -> None:
        """Every workload on a fresh broker (own data dir, own bucket), so that background
        work left by one workload (compaction, a memory engine's contents) cannot slow the
        next; the catch-up read and the raw-store ceilings follow the catch-up workload."""
        if name.startswith("tansu") and self.tansu is None:
            for w in self.workloads:
                self.results.add(
                    name, w.name, "produce_mib_s", None, "MiB/s", error=self.tansu_error
                )
            return
        peaks: list[int] = []
        for w in self.workloads:
            log(f"{name}: {w.name} ({w.describe()})")
            system = System(
                name,
                procs,
                self.work / name / w.name,
                tansu=self.tansu,
                moto=moto,
                floe_root=self.opts.floe_root,
                bucket=f"{name}-{w.name}".replace(".", "-") if moto is not None else "",
            )
            wal_sizes: list[int] = []
            try:
                system.start()
                self._workload(procs, system, w)
                if w.fixed and name in (FLOE_FILE, FLOE_S3):
                    wal_sizes = system.list_wal_sizes()
                if w.name == CATCHUP_WORKLOAD and name != NULL:
                    self._catchup(procs, system)
            except Exception as e:
                tail = system.proc.tail(15) if system.proc is not None else ""
                msg = f"{type(e).__name__}: {e}"
                self.results.error(name, w.name, f"{msg}\n{tail}".strip())
                log(f"{name}: FAILED {msg}\n{traceback.format_exc()}")
            finally:
                system.stop()
                peaks.append(system.peak_rss_bytes)
                if peaks[-1]:  # which workload drives the peak
                    self.results.add(name, w.name, "peak_rss_mib", peaks[-1] / 2**20, "MiB",
                                     False, "this workload's broker (VmHWM)")
            if w.name == CATCHUP_WORKLOAD and name in (FLOE_FILE, FLOE_S3):
                self._raw_store(name, system)
            if w.fixed and name in (FLOE_FILE, FLOE_S3):
                self._put_latency(name, system, w, wal_sizes)
            self._clean(system)
        if peaks:
            note = "the highest of the workloads' brokers (VmHWM)"
            self.results.add(name, "all", "peak_rss_mib", max(peaks) / 2**20, "MiB", False, note)

    def _clean(self, system: System) -> None:
        if self.opts.keep_data:
            return
        shutil.rmtree(system.data_dir, ignore_errors=True)
        if system.moto is not None and system.bucket:
            try:
                empty_bucket(system.moto.endpoint, system.bucket)
            except Exception as e:  # moto keeps it in memory: only a cost, not an error
                log(f"could not empty bucket {system.bucket}: {e}")

    def _workload(self, procs: Processes, system: System, w: Workload) -> None:
        topic = f"bench-{w.name}"
        create_topic(system.bootstrap, topic, w.partitions)
        # the null engine's Fetch returns nothing, but its ceiling carries the same tailing
        # consumer (its requests, its process on the shared cores) as the systems it bounds
        r = produce(
            procs, system, w, topic, self.raw_dir, tail_consumer=w.fixed,
            consumer_reads=system.name != NULL,
        )
        if r.error and system.problems():
            r.error += f"; broker log: {system.problems()}"
        if r.error and system.proc is not None and not system.proc.alive():
            r.error += f"; broker exited ({system.proc.popen.returncode})"
        add_run(self.results, w, r)
        if r.error:
            self.results.error(system.name, w.name, r.error)
        acked = int(r.produce.get("acked", 0))
        if not w.fixed and system.name != NULL and acked:
            read, _cpu = consume_all(
                procs,
                system,
                topic,
                w.partitions,
                acked,
                self.raw_dir,
                f"{system.name}.{w.name}.read",
                read_timeout(acked, w.size),
            )
            add_read(self.results, system.name, w.name, "consume_mib_s", read, acked)
        if w.name == CATCHUP_WORKLOAD:
            system.written[topic] = (w.partitions, acked, w.size)
            if system.name in (FLOE_FILE, FLOE_S3):
                system.wal_sizes = system.list_wal_sizes()

    def _catchup(self, procs: Processes, system: System) -> None:
        if system.name not in DURABLE_AFTER_RESTART:
            self.results.add(
                system.name,
                "catchup",
                "catchup_mib_s",
                None,
                "MiB/s",
                error="the memory engine keeps nothing across a restart",
            )
            return
        for topic, (partitions, acked, size) in system.written.items():
            if not acked:
                continue
            log(f"{system.name}: restart, cold read of {topic}")
            system.restart()
            read, _cpu = consume_all(
                procs,
                system,
                topic,
                partitions,
                acked,
                self.raw_dir,
                f"{system.name}.catchup",
                read_timeout(acked, size),
            )
            add_read(self.results, system.name, "catchup", "catchup_mib_s", read, acked)

    def _raw_store(self, name: str, system: System) -> None:
        raw_name = RAW[name]
        log(f"{raw_name}: sequential GET/PUT of the broker's objects")
        budget = 1.0 if self.opts.quick else 8.0
        r = ceilings.raw_object_store(system.object_store_url, system.wal_sizes, budget_s=budget)
        note = (
            f"GET: {r.objects} objects, {r.bytes / 2**20:.0f} MiB; PUT: {r.put_objects} objects "
            f"of the sizes the WAL wrote in {CATCHUP_WORKLOAD} (median {r.median_put_bytes:,} B)"
        )
        self.results.add(
            raw_name, "raw", "put_mib_s", r.put_mib_s or None, "MiB/s", note=note, error=r.error
        )
        self.results.add(
            raw_name, "raw", "get_mib_s", r.get_mib_s or None, "MiB/s", note=note, error=r.error
        )

    def _put_latency(self, name: str, system: System, w: Workload, wal_sizes: list[int]) -> None:
        """Sequential PUTs of the median WAL object the fixed-rate workload left, on the same
        store, the broker stopped: the store's own share of a produce latency."""
        raw_name = RAW[name]
        if not wal_sizes:
            self.results.add(raw_name, w.name, "put_p99_ms", None, "ms", False,
                             error="the broker left no WAL object to size the PUTs by")
            return
        size = wal_sizes[len(wal_sizes) // 2]
        log(f"{raw_name}: sequential PUTs of {size:,} B (median WAL object of {w.name})")
        count = 20 if self.opts.quick else ceilings.PUT_LATENCY_COUNT
        r = ceilings.put_latency(system.object_store_url, size, count)
        note = f"{r.puts} sequential PUTs of {size:,} B, the median WAL object of {w.name}"
        for q, v in (("50", r.p50_ms), ("99", r.p99_ms)):
            self.results.add(raw_name, w.name, f"put_p{q}_ms", v if r.puts else None, "ms",
                             False, note, error=r.error)

    # -- table topics and conversion ---------------------------------------------------------
    def _table(self, procs: Processes) -> None:
        log("floe-file: table topic (steady freshness, backlog rows/s)")
        plan = table_plan(self.opts.quick)
        system = System(
            FLOE_FILE, procs, self.work / "table", metrics=True, floe_root=self.opts.floe_root
        )
        name = "table"
        try:
            system.start()
            t = tablebench.run(procs, system, plan, self.raw_dir)
        except Exception as e:
            self.results.error(FLOE_FILE, name, f"{type(e).__name__}: {e}")
            return
        finally:
            system.stop()
            if system.peak_rss_bytes:
                self.results.add(FLOE_FILE, name, "peak_rss_mib", system.peak_rss_bytes / 2**20,
                                 "MiB", False, "the table workload's broker (VmHWM)")
        r = self.results
        err = t.error
        note = (
            f"offered {plan.rate:,.0f} JSON records/s of {plan.size} B, {plan.partitions} "
            "partitions: rows committed / (last commit - first ack)"
        )
        r.add(FLOE_FILE, name, "rows_s", t.rows_s or None, "rows/s", note=note, error=err)
        for q in ("p50", "p99"):
            v = t.freshness_s.get(q)
            r.add(
                FLOE_FILE,
                name,
                f"freshness_{q}_s",
                v,
                "s",
                False,
                note=(
                    "commit.interval.ms=1000; ack to first returned by a pyiceberg scan of the "
                    f"current snapshot (polled every 50 ms); never returned: {t.missing:,}"
                ),
                error=err,
            )
        r.add(
            FLOE_FILE,
            name,
            "backlog_rows_s",
            t.backlog_rows_s or None,
            "rows/s",
            note=f"{t.backlog_rows:,} rows already in the log when the table is enabled",
            error=err,
        )
        acked = t.steady.produce.get("acked") if t.steady else None
        check = t.check
        rows_err = "" if check is not None else (err or "the table was not read")
        if check is not None and check.problem:
            rows_err = check.problem
        r.add(
            FLOE_FILE,
            name,
            "iceberg_rows",
            check.rows if check is not None else None,
            "rows",
            note=(
                "rows of the steady table's current snapshot, compared as (partition, offset) "
                f"pairs with the {acked} acknowledged"
            ),
            error=rows_err,
        )
        self.results.series["freshness"] = sorted(t.freshness_samples)
        if t.error:
            r.error(FLOE_FILE, name, t.error)

    def _conversion(self) -> None:
        plan = table_plan(self.opts.quick)
        log(f"in-process: Converter vs pyarrow write_table, {plan.convert_rows:,} rows")
        c = ceilings.conversion(plan.convert_rows, plan.size)
        note = f"{c.rows:,} JSON records of {plan.size} B ({c.input_mib:.0f} MiB)"
        for metric in (
            "convert_rows_s",
            "native_rows_s",
            "parquet_rows_s",
            "decode_rows_s",
            "convert_and_write_rows_s",
        ):
            self.results.add("in-process", "table", metric, getattr(c, metric), "rows/s", note=note)


def _overlap(a: str, b: str) -> bool:
    return a in b or b in a
