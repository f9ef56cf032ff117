"""Table freshness on a cluster (issue 13), as a reader of the Iceberg table sees it.

    .venv/bin/python -m benchmarks.tablefreshness_cluster [--quick] [--duration 60]
        [--rate 5000] [--commit-interval-ms 1000] [--kill-leaders] [--profile] [--out DIR]

Three `floe broker` processes on 127.0.0.1 share a file object store, a SQLite metadata
database, one SQLite Iceberg catalog and one file warehouse. A 6-partition JSON table topic
(`table.topic.enable=true`, `convert.value.type=json`, `commit.interval.ms` 1000 by default):
each partition's leader runs its worker, partition 0's leader the commit coordinator.

An idempotent acks=all producer (benchmarks.ackproducer, its own process) sends JSON records
at a steady rate and notes when each (partition, offset) was acknowledged. A reader thread
opens the catalog itself (pyiceberg's SqlCatalog on the catalog database, no broker code),
reads the table's catalog row every 50 ms and loads the table when it moved; when the current
snapshot changes, its summary's `floe.offsets`
says which offsets became visible. A record's freshness = the time the reader had the first
snapshot holding it - the time it was acknowledged. After the producer, a drain period waits
(bounded) until the table holds every acknowledged record; what it still lacks then is
reported as never visible. Also: each broker's CPU seconds during the steady phase, the time
its threads waited for a CPU (schedstat) and its memory (/proc), the coordinator's broker and
the partitions' moves (from /status, polled every 0.5 s), per snapshot when it was committed
(its timestamp) next to when the reader saw it, and whether each snapshot's row count is the
sum of its offsets (every offset is one row here: a difference is a record lost or doubled).
--profile: py-spy record of every broker during the steady phase.

--kill-leaders: one third into the run, SIGKILL the leader of partition 0 (the coordinator
and a worker move); two thirds in, the leader of another partition (a worker moves). After
each kill the victim is started again once a survivor leads its partitions. Per kill:
`takeover_s` (until a survivor's Metadata names a live leader of the victim's partitions),
`resume_s` (until each of them acknowledged a record again), `visible_again_s` (until every
partition has a record acknowledged after the kill visible in the table) and `settled_s`
(until the last record held up by the kill, i.e. visible after it and before the next one,
with a freshness above 2 x the p99 of the records visible before the first kill became
visible).

Figures go to stdout and DIR/tablefreshness-cluster.json; brokers' logs to DIR/logs. Every
process is stopped at the end (also on an error, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.icebergreader import (
    Record,
    Seen,
    TableReader,
    visibility,
)
from benchmarks.procs import Proc, Processes, free_port
from benchmarks.procstat import ProcSample, machine_cpu, own_cpu
from benchmarks.stats import percentiles

TOPIC = "freshness"
TABLE = ("default", "freshness")  # tabletopic.config.default_table_name(TOPIC)
STATUS_POLL_S = 0.5
TIMEOUT_S = 60.0
QS = (50, 90, 99, 99.9)


# -- the statistics (pure) ----------------------------------------------------------------------


def regressions(seen: list[Seen]) -> int:
    """How often a partition's offset in a newer snapshot was lower than before (a bug)."""
    n = 0
    for a, b in itertools.pairwise(seen):
        n += sum(1 for p, o in a.offsets.items() if b.offsets.get(p, 0) < o)
    return n


def row_mismatches(seen: list[Seen]) -> int:
    """Snapshots whose row count is not the sum of their next offsets: every offset of this
    benchmark's topic (from 0, no transactions, valid JSON) is one row, so a difference means
    a record lost or written twice."""
    return sum(1 for s in seen if s.total_records != sum(s.offsets.values()))


def summarize(records: list[Record]) -> dict[str, Any]:
    """Freshness percentiles (s) over the records that became visible, and how many did not;
    also the part from acknowledgement to commit and from commit to the reader."""
    fresh = [f for r in records if (f := r.freshness) is not None]
    to_commit = [r.committed_at - r.acked_at for r in records if r.committed_at is not None]
    to_reader = [r.visible_at - r.committed_at for r in records
                 if r.visible_at is not None and r.committed_at is not None]
    out: dict[str, Any] = {
        "records": len(records),
        "visible": len(fresh),
        "never_visible": len(records) - len(fresh),
        "freshness_s": _rounded(percentiles(fresh, QS)),
        "freshness_max_s": round(max(fresh), 3) if fresh else None,
        "ack_to_commit_s": _rounded(percentiles(to_commit, (50, 99))),
        "commit_to_reader_s": _rounded(percentiles(to_reader, (50, 99))),
    }
    return out


def recovery(records: list[Record], kill_at: float, until: float, bound_s: float,
             victim_partitions: list[int]) -> dict[str, Any]:
    """A kill at `kill_at`, over the records acknowledged before `until` (the next kill) and
    visible between the two (or never): when the victim's partitions took acknowledgements again,
    when every partition had a record acknowledged after the kill visible, and when the last
    one with a freshness above `bound_s` became visible."""
    hit = [r for r in records if r.acked_at < until and (
        r.visible_at is None or kill_at <= r.visible_at < until)]  # later: the next kill's
    first: dict[int, Record] = {}
    for r in sorted(hit, key=lambda r: r.acked_at):
        if r.acked_at >= kill_at:
            first.setdefault(r.partition, r)
    partitions = {r.partition for r in records}
    visible = [first[p].visible_at if p in first else None for p in sorted(partitions)]
    resumed = [first[p].acked_at for p in victim_partitions if p in first]
    late = [r for r in hit if r.freshness is None or r.freshness > bound_s]
    fresh = [f for r in hit if (f := r.freshness) is not None]
    return {
        "resume_s": _r(max(resumed) - kill_at) if len(resumed) == len(victim_partitions)
        else None,
        "visible_again_s": None if any(v is None for v in visible)
        else _r(max(v for v in visible if v is not None) - kill_at),
        "settled_s": None if any(r.visible_at is None for r in late)
        else _r(max((r.visible_at for r in late if r.visible_at is not None),
                    default=kill_at) - kill_at),
        "late_records": len(late),
        "freshness_max_s": _r(max(fresh)) if fresh else None,
    }


def timeline(records: list[Record], start: float, bucket_s: float = 1.0) -> list[list[Any]]:
    """Per `bucket_s` of acknowledgement time since `start`: [second, records, max freshness
    (None if one never became visible)]."""
    buckets: dict[int, list[float | None]] = {}
    for r in records:
        buckets.setdefault(int((r.acked_at - start) // bucket_s), []).append(r.freshness)
    out: list[list[Any]] = []
    for b, fs in sorted(buckets.items()):
        worst = None if any(f is None for f in fs) else max(f for f in fs if f is not None)
        out.append([round(b * bucket_s, 1), len(fs), _r(worst)])
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in d.items()}


# -- the reader -------------------------------------------------------------------------------


# -- the cluster ------------------------------------------------------------------------------


class Cluster:
    def __init__(self, procs: Processes, data: Path, nodes: int) -> None:
        self.procs, self.data = procs, data
        self.ports = {n: free_port() for n in range(1, nodes + 1)}
        self.brokers: dict[int, Proc] = {}
        self.admin: dict[int, str] = {}  # node -> admin HOST:PORT (/status)
        self._clients: dict[str, Any] = {}  # bootstrap -> AdminClient
        self.catalog = f"sqlite:///{data / 'catalog.db'}"
        self.warehouse = (data / "warehouse").as_uri()

    def start(self, node: int) -> None:
        self.brokers[node] = b = self.procs.start(f"broker{node}", [
            sys.executable, "-m", "broker.cli", "broker", "--node-id", str(node),
            "--listen", f"127.0.0.1:{self.ports[node]}", "--data-dir", str(self.data / f"b{node}"),
            "--object-store", (self.data / "objects").as_uri(),
            "--metadata", f"sqlite:///{self.data / 'meta.db'}",
            "--catalog", self.catalog, "--warehouse", self.warehouse,
            "--metrics", "127.0.0.1:0", "--schema-registry", "",
        ], wait_for="metrics on", timeout=TIMEOUT_S)
        wait_until(lambda: bool(b.address))  # `listening on` comes after `metrics on`
        self.admin[node] = b.line_matching(r"metrics on (\S+)") or ""

    def kill(self, node: int) -> None:
        self.procs.stop(self.brokers.pop(node), signal.SIGKILL)

    def bootstrap(self, *nodes: int) -> str:
        return ",".join(f"127.0.0.1:{self.ports[n]}" for n in nodes or self.brokers)

    def leaders(self, *nodes: int) -> dict[int, int]:
        from confluent_kafka.admin import AdminClient

        bootstrap = self.bootstrap(*nodes)
        if bootstrap not in self._clients:
            self._clients[bootstrap] = AdminClient({"bootstrap.servers": bootstrap})
        md = self._clients[bootstrap].list_topics(TOPIC, timeout=3)
        t = md.topics[TOPIC]
        if t.error is not None:
            raise RuntimeError(str(t.error))
        return {p: t.partitions[p].leader for p in t.partitions}

    def samples(self) -> dict[int, ProcSample | None]:
        return {n: b.sample() for n, b in sorted(self.brokers.items())}

    def waits(self) -> dict[int, float | None]:
        return {n: runqueue_wait_s(b.pid) for n, b in sorted(self.brokers.items())}


def runqueue_wait_s(pid: int) -> float | None:
    """Seconds the threads of `pid` (those alive now) spent runnable but waiting for a CPU
    (/proc/PID/task/TID/schedstat, second field): how much the machine starved it."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    except OSError:
        return None
    return total / 1e9


def wait_until(check: Callable[[], bool], timeout: float = TIMEOUT_S) -> float:
    """Seconds until check() holds (polled every 20 ms); TimeoutError after `timeout`."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if check():
                return time.monotonic() - began
        except Exception:  # a broker not answering (yet)
            pass
        time.sleep(0.02)
    raise TimeoutError("condition not met")


def even(leaders: dict[int, int], nodes: list[int]) -> bool:
    counts = [sum(1 for n in leaders.values() if n == node) for node in nodes]
    return all(n in nodes for n in leaders.values()) and max(counts) - min(counts) <= 1


@dataclass
class StatusPoller:
    """Every broker's /status table entry every STATUS_POLL_S: who coordinates, the
    workers."""

    cluster: Cluster
    coordinators: list[tuple[float, int]] = field(default_factory=list)  # (when, node) changes
    last: dict[int, dict[str, Any]] = field(default_factory=dict)  # node -> its table's status
    history: list[dict[str, Any]] = field(default_factory=list)  # a compact line per answer
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def fetch(self, node: int) -> dict[str, Any] | None:
        try:
            url = f"http://{self.cluster.admin[node]}/status"
            with urllib.request.urlopen(url, timeout=2) as r:
                tables = json.loads(r.read())["tables"]
        except (OSError, ValueError, KeyError):
            return None
        return next((t for t in tables if t["topic"] == TOPIC), None)

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in list(self.cluster.brokers):
                t = self.fetch(node)
                if t is None:
                    continue
                self.last[node] = t
                self.history.append(compact_status(time.time(), node, t))
                if t.get("coordinator", {}).get("active") and (
                        not self.coordinators or self.coordinators[-1][1] != node):
                    self.coordinators.append((time.time(), node))
            self._stop.wait(STATUS_POLL_S)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="status poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


def compact_status(at: float, node: int, t: dict[str, Any]) -> dict[str, Any]:
    """What a broker's /status says of the table, in short: its coordinator's commits and
    last commit's seconds, per partition it writes (lag records, records held, file sets
    waiting for a commit)."""
    coord = t.get("coordinator") or {}
    return {
        "at": round(at, 3), "node": node, "coordinator": bool(coord.get("active")),
        "commits": coord.get("commits"), "conflicts": coord.get("conflicts"),
        "last_commit_seconds": (t.get("freshness") or {}).get("last_commit_seconds"),
        "last_error": t.get("last_error"),
        "partitions": {p["partition"]: [p.get("lag_records"), p.get("pending_records"),
                                        p.get("file_sets_waiting")]
                       for p in t.get("partitions", [])},
    }


def leader_moves(history: list[dict[str, Any]], start: float) -> list[list[Any]]:
    """[seconds since start, partition, from node, to node] each time /status shows a
    partition's worker on another broker than before (a failover or a rebalance)."""
    where: dict[int, int] = {}
    moves: list[list[Any]] = []
    for h in sorted(history, key=lambda h: h["at"]):
        for p in h["partitions"]:
            p = int(p)
            if where.get(p, h["node"]) != h["node"]:
                moves.append([round(h["at"] - start, 2), p, where[p], h["node"]])
            where[p] = h["node"]
    return moves


def gaps(seen: list[Seen]) -> dict[str, float]:
    """Seconds between successive snapshots' timestamps (the commit rhythm)."""
    d = [b.committed_at - a.committed_at for a, b in itertools.pairwise(seen)]
    return {**_rounded(percentiles(d, (50, 99))), "max": round(max(d), 3) if d else math.nan}


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Plan:
    brokers: int = 3
    partitions: int = 6
    rate: float = 5_000
    duration: float = 60.0
    size: int = 256
    commit_interval_ms: int = 1000
    drain_s: float = 60.0
    kill_leaders: bool = False
    profile: bool = False


def table_configs(plan: Plan) -> dict[str, str]:
    return {
        "table.topic.enable": "true",
        "table.topic.convert.value.type": "json",
        "table.topic.commit.interval.ms": str(plan.commit_interval_ms),
    }


def run(plan: Plan, out: Path, keep_data: bool) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="floe-tablefresh-"))
    try:
        with Processes(out / "logs") as procs:
            return _run(plan, out, procs, Cluster(procs, data, plan.brokers))
    finally:
        if not keep_data:
            shutil.rmtree(data, ignore_errors=True)


def _run(plan: Plan, out: Path, procs: Processes, cluster: Cluster) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    nodes = list(range(1, plan.brokers + 1))
    for n in nodes:
        cluster.start(n)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap()})
    admin.create_topics([NewTopic(TOPIC, plan.partitions, 1, config=table_configs(plan))])[
        TOPIC].result(timeout=TIMEOUT_S)
    placed: dict[int, int] = {}
    wait_until(lambda: placed.update(cluster.leaders()) is None and len(placed) == plan.partitions
               and even(placed, nodes))
    status = StatusPoller(cluster)
    status.start()
    reader = TableReader(cluster.catalog, cluster.warehouse, TABLE)
    reader.start()
    result: dict[str, Any] = {"plan": asdict(plan), "leaders_at_start": placed}
    try:
        wait_until(lambda: bool(reader.seen) or any(
            t.get("partitions") for t in status.last.values()))
        busy0, total0 = machine_cpu()
        own0 = own_cpu()  # this process (the reader) and, once it exited, the producer
        before, waited0 = cluster.samples(), cluster.waits()
        p_out = out / "producer.json"
        producer = procs.start("producer", [
            sys.executable, "-m", "benchmarks.ackproducer", "--bootstrap", cluster.bootstrap(),
            "--topic", TOPIC, "--partitions", str(plan.partitions), "--rate", str(plan.rate),
            "--duration", str(plan.duration), "--size", str(plan.size), "--out", str(p_out),
        ], wait_for="producing", timeout=TIMEOUT_S)
        started = time.time()
        spies = _profile(cluster, plan.duration, out) if plan.profile else {}
        kills = _kill_leaders(plan, cluster, started, producer) if plan.kill_leaders else []
        if producer.wait(plan.duration + 150) is None:
            raise RuntimeError("the producer did not finish in time")
        after, waited1 = cluster.samples(), cluster.waits()
        busy1, total1 = machine_cpu()
        _profiled(spies, out)
        own1 = own_cpu()
        produced: dict[str, Any] = json.loads(p_out.read_text())
        acks = {int(p): [(int(o), float(t)) for o, t in e]
                for p, e in produced.pop("acks").items()}
        goal = {p: max(o for o, _t in e) + 1 for p, e in acks.items() if e}
        drained = reader.wait_for(goal, plan.drain_s)
        ended = cluster.samples()
    finally:
        reader.stop()
        status.stop()
    records = visibility(acks, reader.seen)
    brokers = _brokers(before, after, ended, {k["victim"] for k in kills})
    for n, b in brokers.items():
        w0, w1 = 0.0 if b["restarted"] else waited0.get(n), waited1.get(n)
        b["runqueue_wait_s"] = _r(w1 - w0) if w0 is not None and w1 is not None else None
    result.update({
        "producer": produced,
        "drained": drained,
        **summarize(records),
        "offset_regressions": regressions(reader.seen),
        "row_mismatches": row_mismatches(reader.seen),
        "snapshots_seen": len(reader.seen),
        "snapshot_gaps_s": gaps(reader.seen),
        "snapshots": [[_r(x.at - started), _r(x.committed_at - started), x.total_records,
                       x.offsets] for x in reader.seen],
        "reader": {"polls": reader.polls, "loads": reader.loads, "load_ms_mean": _r(
            reader.load_s / max(reader.loads, 1) * 1000), "errors": reader.errors,
            "last_error": reader.last_error},
        "brokers": brokers,
        "cpu": cpu_shares(busy1 - busy0, total1 - total0, own1 - own0,
                          sum(b["cpu_s"] or 0.0 for b in brokers.values())),
        "coordinators": status.coordinators,
        "last_status": status.last,
        "status_history": status.history,
        "leader_moves": leader_moves(status.history, started),
        "timeline": timeline(records, started),
        "kills": kills,
    })
    if kills:
        steady = [r for r in records  # visible before the first kill
                  if r.visible_at is not None and r.visible_at < kills[0]["at"]]
        bound = 2 * (percentiles([f for r in steady if (f := r.freshness) is not None],
                                 (99,))["p99"] if steady else 1.0)
        result["kill_bound_s"] = _r(bound)
        for i, k in enumerate(kills):
            until = kills[i + 1]["at"] if i + 1 < len(kills) else float("inf")
            k.update(recovery(records, k["at"], until, bound, k["victim_partitions"]))
        result["before_first_kill"] = summarize(steady)
    return result


def cpu_shares(busy_s: float, total_s: float, bench_s: float, brokers_s: float
               ) -> dict[str, float | None]:
    """Shares of the machine's CPU time during the steady phase: everything busy, the
    brokers, this benchmark (reader, producer), and the rest (other processes)."""
    if total_s <= 0:
        return {"busy": None, "brokers": None, "bench": None, "other": None}
    other = max(0.0, busy_s - bench_s - brokers_s)
    return {"busy": _r(busy_s / total_s), "brokers": _r(brokers_s / total_s),
            "bench": _r(bench_s / total_s), "other": _r(other / total_s)}


def _brokers(before: dict[int, ProcSample | None], after: dict[int, ProcSample | None],
             ended: dict[int, ProcSample | None], restarted: set[int]) -> dict[int, dict[str, Any]]:
    """CPU seconds during the steady phase (a restarted broker's: since its restart), RSS."""
    out: dict[int, dict[str, Any]] = {}
    for n, a in after.items():
        b, e = before.get(n), ended.get(n)
        cpu0 = 0.0 if n in restarted else (b.cpu_s if b is not None else None)
        out[n] = {
            "restarted": n in restarted,
            "cpu_s": _r(a.cpu_s - cpu0) if a is not None and cpu0 is not None else None,
            "rss_mib": round(e.rss_bytes / 2**20) if e is not None else None,
            "peak_rss_mib": round(e.peak_rss_bytes / 2**20) if e is not None else None,
        }
    return out


def _profile(cluster: Cluster, seconds: float, out: Path) -> dict[int, subprocess.Popen[bytes]]:
    """`py-spy record` (50 Hz, collapsed stacks) of every broker for the steady phase."""
    spy = str(Path(sys.executable).with_name("py-spy"))
    return {n: subprocess.Popen(
        [spy, "record", "--pid", str(b.pid), "--rate", "50", "--format", "raw", "--duration",
         str(int(seconds)), "--output", str(out / f"profile-broker{n}.raw"), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for n, b in cluster.brokers.items()}


def _profiled(spies: dict[int, subprocess.Popen[bytes]], out: Path) -> None:
    """Wait for the profilers (bounded), then each broker's top frames into a text file."""
    from benchmarks.catchup import top_frames

    for n, spy in spies.items():
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait(5)
        raw = out / f"profile-broker{n}.raw"
        if raw.exists():
            (out / f"profile-broker{n}.txt").write_text("\n".join(top_frames(raw, 40)) + "\n")


def _kill_leaders(plan: Plan, cluster: Cluster, started: float,
                  producer: Proc) -> list[dict[str, Any]]:
    """SIGKILL the leader of partition 0, then of another partition (a broker not leading
    partition 0); each time start the victim again once survivors lead its partitions."""
    kills: list[dict[str, Any]] = []
    nodes = sorted(cluster.brokers)
    for when in (plan.duration / 3, 2 * plan.duration / 3):
        while time.time() < started + when and producer.alive():
            time.sleep(0.05)
        placed = cluster.leaders()
        victim = placed[0] if not kills else next(
            n for p, n in sorted(placed.items()) if n != placed[0])
        mine = [p for p, n in sorted(placed.items()) if n == victim]
        survivors = [n for n in cluster.brokers if n != victim]
        cluster.kill(victim)
        at = time.time()

        def taken_over(s: list[int] = survivors, m: list[int] = mine) -> bool:
            return all(cluster.leaders(*s)[p] in s for p in m)

        takeover = wait_until(taken_over)
        print(f"kill {len(kills) + 1}: broker {victim} (partitions {mine}) at"
              f" {at - started:.1f} s; survivors lead them after {takeover:.2f} s", flush=True)
        cluster.start(victim)
        try:
            wait_until(lambda: even(cluster.leaders(), nodes))
        except TimeoutError:
            print("  leaders not even again within 60 s", flush=True)
        kills.append({"at": at, "at_s": _r(at - started), "victim": victim,
                      "victim_partitions": mine, "takeover_s": _r(takeover),
                      "restarted_s": _r(time.time() - at)})
    return kills


# -- the report -------------------------------------------------------------------------------


def report(res: dict[str, Any]) -> str:
    plan = res["plan"]
    f = res["freshness_s"]
    lines = [
        f"{plan['brokers']} brokers, {plan['partitions']} partitions, {plan['rate']:,.0f}"
        f" records/s x {plan['size']} B JSON for {plan['duration']:g} s,"
        f" commit.interval.ms={plan['commit_interval_ms']}",
        f"producer: sent {res['producer']['sent']}, acked {res['producer']['acked']},"
        f" errors {res['producer']['errors']}, fell behind by at most"
        f" {res['producer']['behind_max_s']} s; its CPU {res['producer'].get('cpu_s')} s",
        f"freshness (reader): p50 {f['p50']} s, p90 {f['p90']} s, p99 {f['p99']} s,"
        f" max {res['freshness_max_s']} s over {res['visible']} records;"
        f" never visible {res['never_visible']} (drained: {res['drained']})",
        f"  ack -> commit p50 {res['ack_to_commit_s']['p50']} s p99"
        f" {res['ack_to_commit_s']['p99']} s; commit -> reader p50"
        f" {res['commit_to_reader_s']['p50']} s p99 {res['commit_to_reader_s']['p99']} s",
        f"snapshots seen {res['snapshots_seen']} (gaps between them: p50"
        f" {res['snapshot_gaps_s']['p50']} s, p99 {res['snapshot_gaps_s']['p99']} s, max"
        f" {res['snapshot_gaps_s']['max']} s), offset regressions"
        f" {res['offset_regressions']}, snapshots whose rows differ from their offsets"
        f" {res['row_mismatches']}; reader polls {res['reader']['polls']}, loads"
        f" {res['reader']['loads']}"
        f" ({res['reader']['load_ms_mean']} ms each), errors {res['reader']['errors']}",
        "coordinator: " + ", ".join(f"broker {n}" for _t, n in res["coordinators"]),
    ]
    moves = res["leader_moves"]
    lines.append(f"partition moves seen in /status ({'kills' if res['kills'] else 'no kill'}):"
                 + (" none" if not moves else ", ".join(
                     f"p{p} {a}->{b} at {t:g} s" for t, p, a, b in moves)))
    worst = sorted((b for b in res["timeline"] if b[2] is not None), key=lambda b: -b[2])[:5]
    lines.append("worst seconds (acknowledged at s: max freshness): " + ", ".join(
        f"{b[0]:g}: {b[2]}" for b in sorted(worst)))
    for n, b in res["brokers"].items():
        lines.append(f"broker {n}: CPU {b['cpu_s']} s during the steady phase (waited"
                     f" {b['runqueue_wait_s']} s for a CPU), RSS"
                     f" {b['rss_mib']} MiB (peak {b['peak_rss_mib']} MiB)")
    c = res["cpu"]
    lines.append(f"machine CPU during the steady phase: busy {c['busy']}, brokers {c['brokers']},"
                 f" benchmark (producer, reader) {c['bench']}, other processes {c['other']}")
    for i, k in enumerate(res["kills"], 1):
        lines.append(
            f"kill {i}: broker {k['victim']} (partitions {k['victim_partitions']}) at"
            f" {k['at_s']} s: takeover {k['takeover_s']} s, acks again {k['resume_s']} s,"
            f" every partition visible again {k['visible_again_s']} s, settled"
            f" {k['settled_s']} s (records over {res['kill_bound_s']} s: {k['late_records']},"
            f" worst {k['freshness_max_s']} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tablefreshness_cluster")
    ap.add_argument("--quick", action="store_true", help="15 s of producing (default 60 s)")
    ap.add_argument("--duration", type=float, help="seconds of producing")
    ap.add_argument("--rate", type=float, default=5_000, help="records/s (default 5000)")
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--drain", type=float, default=60.0, help="max seconds to wait at the end")
    ap.add_argument("--kill-leaders", action="store_true",
                    help="SIGKILL partition 0's leader at 1/3, another leader at 2/3")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy record every broker (DIR/profile-brokerN.raw, .txt: top frames)")
    ap.add_argument("--keep-data", action="store_true")
    ap.add_argument("--out", default="bench-out/tablefreshness-cluster")
    args = ap.parse_args(argv)
    duration = args.duration or (15.0 if args.quick else 60.0)
    plan = Plan(rate=args.rate, duration=duration, commit_interval_ms=args.commit_interval_ms,
                drain_s=args.drain, kill_leaders=args.kill_leaders, profile=args.profile)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: processes stopped
    res = run(plan, out, args.keep_data)
    (out / "tablefreshness-cluster.json").write_text(json.dumps(res, indent=1, default=str))
    print(report(res))
    return 0 if res["never_visible"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
