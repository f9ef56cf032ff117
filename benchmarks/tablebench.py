"""Table topics: freshness and rows/s of floe's Iceberg writer.

Steady: JSON records at a fixed rate into a topic with `table.topic.enable=true`,
`convert.value.type=json`, `commit.interval.ms=1000`. The producer records when each
(partition, offset) was acknowledged (wall clock); a reader (benchmarks.icebergreader, its own
pyiceberg catalog on the catalog database) polls the table every 50 ms and, when a new snapshot
is current, scans the data files it has not read yet. Freshness of a record = the moment a
scan of the current snapshot first returned its row - its ack (so it carries up to 50 ms of
polling delay and the reader's own load and scan time); records never returned are counted,
not dropped. After the run the current snapshot is read whole and its (partition, offset)
pairs compared with the acknowledged ones (missing, never acknowledged, duplicated).

Backlog: JSON records produced at max rate into a topic whose table is off; then the table is
switched on (IncrementalAlterConfigs) and the time until the table holds them all gives the
writer's catch-up rows/s.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.drive import RunResult, create_topic, produce
from benchmarks.icebergreader import (
    RowCheck,
    TableReader,
    compare_rows,
    row_visibility,
    scan_offsets,
)
from benchmarks.procs import Processes
from benchmarks.stats import percentiles
from benchmarks.systems import System
from benchmarks.workloads import TablePlan, Workload
from tabletopic.config import default_table_name

POLL_S = 0.05
NAMESPACE = "default"
TABLE_CONFIGS = {
    "table.topic.enable": "true",
    "table.topic.convert.value.type": "json",
    "table.topic.commit.interval.ms": "1000",
}


@dataclass
class StatusPoller:
    address: str
    topic: str
    samples: list[tuple[float, dict[int, int], int]] = field(default_factory=list)
    last_error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def fetch(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{self.address}/status", timeout=5) as r:
                tables = json.loads(r.read())["tables"]
        except (OSError, ValueError) as e:
            self.last_error = str(e)
            return None
        return next((t for t in tables if t["topic"] == self.topic), None)

    def _run(self, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        while not self._stop.is_set() and time.monotonic() < end:
            t = self.fetch()
            now = time.time()
            if t is not None:
                committed = {p["partition"]: p["committed_offset"] for p in t["partitions"]}
                self.samples.append((now, committed, t["rows"]))
                if t.get("last_error"):
                    self.last_error = t["last_error"]
            self._stop.wait(POLL_S)

    def start(self, limit_s: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(limit_s,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def committed(self) -> dict[int, int]:
        return dict(self.samples[-1][1]) if self.samples else {}

    def wait_until(self, goal: dict[int, int], timeout_s: float) -> bool:
        """Until every partition's committed offset reaches its goal (bounded)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            c = self.committed()
            if all(c.get(p, -1) >= o for p, o in goal.items()):
                return True
            time.sleep(POLL_S)
        return False


def wait_for_table(address: str, topic: str, timeout_s: float = 30) -> bool:
    poller = StatusPoller(address, topic)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        t = poller.fetch()
        if t is not None and t["partitions"]:
            return True
        time.sleep(0.1)
    return False


@dataclass
class TableRun:
    steady: RunResult | None = None
    freshness_s: dict[str, float] = field(default_factory=dict)
    rows_s: float = 0.0
    missing: int = 0  # acknowledged records no scan returned before the end
    check: RowCheck | None = None  # the steady table's current snapshot vs the acks
    backlog_rows_s: float = 0.0
    backlog_rows: int = 0
    # (seconds after the switch, rows in the table), every status poll
    backlog_samples: list[tuple[float, int]] = field(default_factory=list)
    freshness_samples: list[float] = field(default_factory=list)
    error: str = ""


def run(procs: Processes, system: System, plan: TablePlan, out_dir: Path) -> TableRun:
    res = TableRun()
    address = system.metrics_address
    if address is None:
        res.error = "the broker printed no `metrics on` line"
        return res
    _steady(procs, system, plan, out_dir, address, res)
    _backlog(procs, system, plan, out_dir, address, res)
    return res


def _steady(
    procs: Processes, system: System, plan: TablePlan, out_dir: Path, address: str, res: TableRun
) -> None:
    topic = "table-steady"
    create_topic(system.bootstrap, topic, plan.partitions, TABLE_CONFIGS)
    if not wait_for_table(address, topic):
        res.error = "the table writer did not start"
        return
    w = Workload("table-json", plan.size, plan.partitions, plan.rate, plan.duration)
    catalog, warehouse = catalog_of(system.data_dir)
    table = (NAMESPACE, default_table_name(topic))
    reader = TableReader(catalog, warehouse, table, scan_rows=True)
    reader.start()
    acks: dict[int, list[tuple[int, float]]] = {}
    try:
        run = produce(procs, system, w, topic, out_dir, False, record_acks=True, json_values=True)
        res.steady = run
        acks = {int(p): e for p, e in run.produce.get("acks", {}).items()}
        goal = {p: max(o for o, _t in e) + 1 for p, e in acks.items() if e}
        if not reader.wait_for(goal, 60):
            res.error = f"table did not catch up within 60 s ({reader.last_error})"
    finally:
        reader.stop()
    records = row_visibility(acks, reader.rows)
    fresh = [f for r in records if (f := r.freshness) is not None]
    res.missing = len(records) - len(fresh)
    res.freshness_samples = fresh
    res.freshness_s = percentiles(fresh, (50, 99, 99.9))
    if reader.duplicates and not res.error:
        res.error = f"the reader's scans returned {reader.duplicates} rows twice"
    first_ack = min((t for e in acks.values() for _o, t in e), default=0.0)
    if reader.seen and first_ack:
        last = reader.seen[-1]
        res.rows_s = last.total_records / max(last.at - first_ack, 1e-9)
    try:
        rows = scan_offsets(catalog, warehouse, table)
    except Exception as e:
        res.error = res.error or f"reading the table: {type(e).__name__}: {e}"
        return
    res.check = compare_rows(((p, o) for p, e in acks.items() for o, _t in e), rows)


def catalog_of(data_dir: Path) -> tuple[str, str]:
    """The SQLite catalog and file warehouse a floe-file broker keeps in its data dir."""
    return (
        f"sqlite:///{(data_dir / 'catalog.db').resolve()}",
        (data_dir / "warehouse").resolve().as_uri(),
    )


def _backlog(
    procs: Processes,
    system: System,
    plan: TablePlan,
    out_dir: Path,
    address: str,
    res: TableRun,
    on_switch: Callable[[], None] | None = None,
    extra_configs: dict[str, str] | None = None,
) -> None:
    """`on_switch` runs right before the table is switched on (benchmarks.tablebacklog starts
    its profiler there); `extra_configs`: more topic configs (e.g. the commit interval)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    topic = "table-backlog"
    configs = {**TABLE_CONFIGS, **(extra_configs or {}), "table.topic.enable": "false"}
    create_topic(system.bootstrap, topic, plan.partitions, configs)
    w = Workload("table-backlog", plan.size, plan.partitions, 0, plan.backlog_s)
    run = produce(procs, system, w, topic, out_dir, False, json_values=True)
    acked = int(run.produce.get("acked") or 0)
    if not acked:
        res.error = res.error or f"backlog produce failed: {run.error}"
        return
    admin = AdminClient({"bootstrap.servers": system.bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("table.topic.enable", "true", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    if on_switch is not None:
        on_switch()
    t0 = time.time()
    admin.incremental_alter_configs([resource])[resource].result(30)
    poller = StatusPoller(address, topic)
    poller.start(300)
    try:
        end = time.monotonic() + 240
        while time.monotonic() < end:
            if poller.samples and poller.samples[-1][2] >= acked:
                break
            time.sleep(POLL_S)
    finally:
        poller.stop()
    rows = poller.samples[-1][2] if poller.samples else 0
    done = next((s[0] for s in poller.samples if s[2] >= acked), None)
    res.backlog_rows = rows
    res.backlog_samples = [(round(s[0] - t0, 3), s[2]) for s in poller.samples]
    if done is None:
        res.error = res.error or f"backlog: table holds {rows} of {acked} rows after 240 s"
        return
    res.backlog_rows_s = acked / (done - t0)
