"""Failover time of a floe cluster (issue 12): SIGKILL the leader of a partition while an
idempotent acks=all producer writes to it, and measure how long until the partition takes
acknowledgements again; several kills, median and worst.

    .venv/bin/python -m benchmarks.failover --kills 5 [--metadata URL] [--out DIR]

Three brokers on 127.0.0.1 share a file object store and one metadata database (a SQLite file
by default; `--metadata postgresql://...` for PostgreSQL). Each round kills the current leader
of t-0, measures `takeover` (until a surviving broker's Metadata names a new live leader) and
`resume` (until the first acknowledgement of t-0 after the kill), then starts the killed
broker again and waits for the leaders to be even before the next round. Every process is
stopped at the end; figures are printed and written to DIR/failover.json.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks.procs import Proc, Processes, free_port

PARTITIONS = 3
TIMEOUT_S = 30.0


def leaders(bootstrap: str) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics("t", timeout=2)
    t = md.topics["t"]
    if t.error is not None:
        raise RuntimeError(str(t.error))
    return {p: t.partitions[p].leader for p in t.partitions}


def wait_until(check: object, timeout: float = TIMEOUT_S) -> float:
    """Seconds until check() is true (polled every 20 ms); raises after `timeout`."""
    assert callable(check)
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if check():
                return time.monotonic() - began
        except Exception:  # a broker not answering (yet)
            pass
        time.sleep(0.02)
    raise TimeoutError("condition not met")


class Cluster:
    def __init__(self, procs: Processes, data: Path, metadata: str) -> None:
        self.procs, self.data, self.metadata = procs, data, metadata
        self.ports = {n: free_port() for n in (1, 2, 3)}
        self.brokers: dict[int, Proc] = {}

    def start(self, node: int) -> None:
        self.brokers[node] = self.procs.start(f"broker{node}", [
            sys.executable, "-m", "broker.cli", "broker", "--node-id", str(node),
            "--listen", f"127.0.0.1:{self.ports[node]}", "--data-dir", str(self.data / f"b{node}"),
            "--object-store", (self.data / "objects").as_uri(), "--metadata", self.metadata,
            "--metrics", "", "--schema-registry", "",
        ])

    def bootstrap(self, *nodes: int) -> str:
        return ",".join(f"127.0.0.1:{self.ports[n]}" for n in nodes or self.brokers)


def run(kills: int, metadata: str | None, out: Path) -> dict[str, object]:
    data = Path(tempfile.mkdtemp(prefix="floe-failover-"))
    rounds: list[dict[str, float]] = []
    with Processes(out / "logs") as procs:
        cluster = Cluster(procs, data, metadata or f"sqlite:///{data / 'meta.db'}")
        for n in (1, 2, 3):
            cluster.start(n)
        bootstrap = cluster.bootstrap()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("t", PARTITIONS, 1)])["t"].result(timeout=TIMEOUT_S)
        wait_until(lambda: sorted(leaders(bootstrap).values()) == [1, 2, 3])
        acks: list[float] = []
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            elif msg.partition() == 0:
                acks.append(time.monotonic())

        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})
        stop = threading.Event()

        def produce() -> None:
            while not stop.is_set():
                producer.produce("t", value=b"x" * 100, partition=0, on_delivery=on_delivery)
                producer.poll(0.005)

        writer = threading.Thread(target=produce, name="producer")
        writer.start()
        try:
            for _ in range(kills):
                time.sleep(1.0)  # steady state
                victim = leaders(bootstrap)[0]
                survivors = [n for n in cluster.brokers if n != victim]
                procs.stop(cluster.brokers.pop(victim), signal.SIGKILL)
                killed = time.monotonic()
                takeover = wait_until(lambda s=survivors: leaders(cluster.bootstrap(*s))[0] in s)
                wait_until(lambda k=killed: any(t > k for t in acks))
                resume = min(t for t in acks if t > killed) - killed
                rounds.append({"victim": victim, "takeover_s": takeover, "resume_s": resume})
                print(f"kill {len(rounds)}: broker {victim}; new leader after {takeover:.2f} s,"
                      f" acks again after {resume:.2f} s", flush=True)
                cluster.start(victim)
                wait_until(lambda: sorted(leaders(bootstrap).values()) == [1, 2, 3])
        finally:
            stop.set()
            writer.join(TIMEOUT_S)
            producer.flush(TIMEOUT_S)
    resumes = [r["resume_s"] for r in rounds]
    takeovers = [r["takeover_s"] for r in rounds]
    return {
        "metadata": "postgresql" if metadata else "sqlite",
        "kills": rounds,
        "resume_median_s": statistics.median(resumes),
        "resume_worst_s": max(resumes),
        "takeover_median_s": statistics.median(takeovers),
        "takeover_worst_s": max(takeovers),
        "delivery_errors": len(errors),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.failover")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--metadata", help="metadata URL (default: a SQLite file)")
    ap.add_argument("--out", default="bench-out/failover")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: processes stopped
    result = run(args.kills, args.metadata, out)
    (out / "failover.json").write_text(json.dumps(result, indent=2))
    print(f"resume: median {result['resume_median_s']:.2f} s, worst"
          f" {result['resume_worst_s']:.2f} s; takeover: median"
          f" {result['takeover_median_s']:.2f} s, worst {result['takeover_worst_s']:.2f} s;"
          f" delivery errors {result['delivery_errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
