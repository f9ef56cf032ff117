"""First throughput benchmark: librdkafka producer and consumer against a floe broker.

    python -m benchmarks.produce_consume [--records 200000] [--size 1024] [--partitions 16]
                                         [--runs 3] [--bootstrap HOST:PORT]

Without --bootstrap it starts its own broker (embedded defaults: local object directory,
SQLite metadata) on a free port in a temporary data directory. The producer and consumer
run in a separate process from the broker (the client is librdkafka, so it is not the
bottleneck). Prints one JSON object per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def produce(
    bootstrap: str, topic: str, records: int, size: int, partitions: int
) -> dict[str, float]:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "compression.type": "none",
        }
    )
    value = b"x" * size
    errors = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal errors
        if err is not None:
            errors += 1

    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.005)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(120)
    elapsed = time.perf_counter() - start
    if errors or left:
        raise SystemExit(f"produce failed: {errors} errors, {left} undelivered")
    return {"produce_mib_s": records * size / elapsed / 2**20, "produce_rec_s": records / elapsed}


def consume(
    bootstrap: str, topic: str, records: int, size: int, partitions: int
) -> dict[str, float]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 2**20,
            "max.partition.fetch.bytes": 8 * 2**20,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    n = 0
    start = time.perf_counter()
    deadline = start + 300
    while n < records and time.perf_counter() < deadline:
        for m in c.consume(10_000, 1.0):
            if m.error() is None:
                n += 1
    elapsed = time.perf_counter() - start
    c.close()
    if n < records:
        raise SystemExit(f"consumed only {n} of {records}")
    return {"consume_mib_s": records * size / elapsed / 2**20, "consume_rec_s": records / elapsed}


def start_broker(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker.cli",
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"broker did not start: {line!r}")
    return proc, line.split("listening on ", 1)[1].strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bootstrap")
    args = ap.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            proc, bootstrap = start_broker(Path(tmp) / "data")
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            results = []
            for run in range(args.runs):
                topic = f"bench-{int(time.time())}-{run}"
                admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
                r = {
                    "run": run,
                    **produce(bootstrap, topic, args.records, args.size, args.partitions),
                }
                r.update(consume(bootstrap, topic, args.records, args.size, args.partitions))
                print(json.dumps({k: round(v, 1) for k, v in r.items()}), flush=True)
                results.append(r)
            medians = {
                k: round(statistics.median(r[k] for r in results), 1)
                for k in results[0]
                if k != "run"
            }
            print(
                json.dumps(
                    {
                        "median": medians,
                        "records": args.records,
                        "size": args.size,
                        "partitions": args.partitions,
                    }
                )
            )
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
