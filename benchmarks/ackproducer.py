"""An idempotent acks=all producer on a fixed timetable that remembers when each record was
acknowledged: the client process of benchmarks.tablefreshness_cluster.

    python -m benchmarks.ackproducer --bootstrap H:P,... --topic T --partitions P --rate R
        --duration S [--size B] --out FILE

Record i (a JSON object of about `--size` bytes, benchmarks.client's) is due at start + i/rate
and goes to partition i % P. The delivery callback notes (offset, wall-clock time) per
partition: the moment the record was acknowledged to the producer. It prints `producing` when
the clock starts, and writes one JSON object to --out: sent, acked, errors, the first error,
unacked (still not acknowledged after --flush-timeout), how far sending fell behind its
timetable, and `acks` {partition: [[offset, acked_at], ...]}. A process of its own, so that
the benchmark's reader does not share an interpreter (and its GIL) with the producer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from benchmarks.client import _json_value

CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    # linger.ms=5 (benchmarks.client's) with idempotence made librdkafka 2.16 take 0.8 of a
    # core at 5,000 records/s on the 3-broker cluster (6.6 CPU s in 8 s; 1.6 s without
    # idempotence, 1.2 s with linger.ms=20), CPU the brokers on 2 shared cores then lacked
    "linger.ms": 20,
    "compression.type": "none",
    "message.timeout.ms": 120_000,  # rides out a leader's failover (a few seconds)
    "socket.nagle.disable": True,
}


class AckProducer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.acks: dict[int, list[tuple[int, float]]] = {}
        self.acked = 0
        self.errors = 0
        self.first_error = ""
        self.behind_s = 0.0  # the most sending fell behind its timetable

    def on_delivery(self, err: Any, msg: Any) -> None:
        now = time.time()
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
            return
        self.acked += 1
        self.acks.setdefault(msg.partition(), []).append((msg.offset(), now))

    def run(self) -> dict[str, Any]:
        from confluent_kafka import KafkaException, Producer

        a = self.args
        p = Producer({"bootstrap.servers": a.bootstrap, **CONFIG, "on_delivery": self.on_delivery})
        try:
            p.list_topics(a.topic, timeout=15)  # connections and metadata before the clock
        except KafkaException as e:
            return {"error": f"metadata: {e}"}
        start_wall = time.time()
        print("producing", flush=True)
        sent = self._fixed(p, time.monotonic())
        unacked = p.flush(a.flush_timeout)
        return {
            "start_wall": start_wall,
            "end_wall": time.time(),
            "scheduled": int(a.rate * a.duration),
            "sent": sent,
            "acked": self.acked,
            "errors": self.errors,
            "first_error": self.first_error,
            "unacked": unacked,
            "behind_max_s": round(self.behind_s, 3),
            "cpu_s": round(_cpu_s(), 2),
            "acks": {str(k): v for k, v in sorted(self.acks.items())},
        }

    def _fixed(self, p: Any, start: float) -> int:
        """Send record i at start + i / rate (benchmarks.client's timetable)."""
        a = self.args
        total = int(a.rate * a.duration)
        sent = 0
        while sent < total:
            now = time.monotonic()
            due = min(total, int((now - start) * a.rate) + 1)
            self.behind_s = max(self.behind_s, now - (start + sent / a.rate))
            while sent < due:
                try:
                    p.produce(a.topic, _json_value(sent, a.size), sent.to_bytes(8, "big"),
                              partition=sent % a.partitions)
                except BufferError:
                    p.poll(0.001)
                    break
                sent += 1
            p.poll(max(0.001, start + sent / a.rate - time.monotonic()))
        return sent


def _cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ackproducer")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--rate", type=float, required=True, help="records/s")
    ap.add_argument("--duration", type=float, required=True, help="seconds of sending")
    ap.add_argument("--size", type=int, default=256, help="bytes per record (key + JSON value)")
    ap.add_argument("--flush-timeout", type=float, default=120.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    result = AckProducer(args).run()
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
