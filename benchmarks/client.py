"""The benchmark's client processes: one librdkafka producer or consumer per process.

    python -m benchmarks.client produce --bootstrap H:P --topic T --partitions P --size B
        [--rate R] --duration S [--json-values] [--record-acks] --out FILE
    python -m benchmarks.client consume --bootstrap H:P --topic T --partitions P
        (--from-end | --from-start) --duration S --out FILE

Every record carries an 8-byte key: the CLOCK_MONOTONIC nanoseconds at which it was meant to
be sent (its slot on the fixed timetable, or the moment it was handed to librdkafka at max
rate); key + value make up `--size` bytes. Producers send round-robin over the partitions with
acks=all, linger.ms=5, no compression, idempotence off. The process only imports
confluent_kafka and this package's stats module, writes one JSON object to --out and exits.
On stdin the consumer accepts one line: the number of records to expect (then it stops once
it has them, or after 15 s without a record).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import threading
import time
from typing import Any

from benchmarks.stats import Timeline

PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "compression.type": "none",
    "enable.idempotence": False,
    "queue.buffering.max.kbytes": 128 * 1024,
    "queue.buffering.max.messages": 1_000_000,
    "message.timeout.ms": 60_000,
    "socket.nagle.disable": True,
}
CONSUMER_CONFIG: dict[str, Any] = {
    "group.id": "floe-bench",
    "enable.auto.commit": False,
    "fetch.max.bytes": 64 * 2**20,
    "max.partition.fetch.bytes": 8 * 2**20,
    "fetch.wait.max.ms": 100,
    "socket.nagle.disable": True,
}
MAX_LATENCY_SAMPLES = 2_000_000
IDLE_STOP_S = 15.0


_PAD = random.Random(7).randbytes(32 * 1024).hex()  # deterministic, not very compressible


def _json_value(i: int, size: int) -> bytes:
    """A JSON object of about `size` - 8 bytes: a few typed fields and a hex `pad`."""
    doc = {"id": i, "user": f"user-{i % 1000}", "amount": i * 0.25, "ok": i % 3 == 0, "pad": ""}
    fixed = len(json.dumps(doc, separators=(",", ":")))
    n = max(0, size - 8 - fixed)
    at = (i * 7919) % (len(_PAD) - n)
    doc["pad"] = _PAD[at : at + n]
    return json.dumps(doc, separators=(",", ":")).encode()


class ProduceRun:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.errors = 0
        self.first_error = ""
        self.acked = 0
        self.latencies: list[int] = []
        self.acks: dict[int, list[tuple[int, float]]] = {}
        self.timeline = Timeline(time.monotonic())
        self.last_ack = 0.0
        self.purging = False
        self.value = b"v" * max(0, args.size - 8)

    def on_delivery(self, err: Any, msg: Any) -> None:
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        if err is not None:
            if self.purging:
                return  # counted as unacked
            self.errors += 1
            if not self.first_error:
                self.first_error = str(err)
            return
        self.acked += 1
        self.last_ack = now
        self.timeline.add(now, 1, self.args.size)
        if self.args.rate and len(self.latencies) < MAX_LATENCY_SAMPLES:  # fixed rate only
            self.latencies.append(now_ns - int.from_bytes(msg.key(), "big"))
        if self.args.record_acks:
            self.acks.setdefault(msg.partition(), []).append((msg.offset(), time.time()))

    def run(self) -> dict[str, Any]:
        from confluent_kafka import KafkaException, Producer

        a = self.args
        p = Producer(
            {"bootstrap.servers": a.bootstrap, **PRODUCER_CONFIG, "on_delivery": self.on_delivery}
        )
        try:
            p.list_topics(a.topic, timeout=15)  # connection and metadata before the clock starts
        except KafkaException as e:
            return {"error": f"metadata: {e}"}
        start = time.monotonic() + 0.02
        self.timeline = Timeline(start)
        scheduled = int(a.rate * a.duration) if a.rate else 0
        sent = self._fixed(p, start) if a.rate else self._max(p, start)
        left = p.flush(a.flush_timeout)
        if left:  # could not keep up: drop the rest rather than wait for it
            self.purging = True
            p.purge()
            p.flush(5)
        elapsed = max(self.last_ack - start, 1e-9)
        out: dict[str, Any] = {
            "scheduled": scheduled,
            "sent": sent,
            "acked": self.acked,
            "errors": self.errors,
            "first_error": self.first_error,
            "unacked": left,
            "elapsed_s": elapsed,
            "mib_s": self.acked * a.size / elapsed / 2**20,
            "rec_s": self.acked / elapsed,
            "latency_ns": sorted(self.latencies),
            "timeline": self.timeline.series(),
        }
        if a.record_acks:
            out["acks"] = {str(k): v for k, v in self.acks.items()}
        return out

    def _value(self, i: int) -> bytes:
        return _json_value(i, self.args.size) if self.args.json_values else self.value

    def _fixed(self, p: Any, start: float) -> int:
        """Send record i at start + i / rate; stop at the end of the timetable even if late."""
        a = self.args
        interval_ns = int(1e9 / a.rate)
        start_ns = int(start * 1e9)
        total = int(a.rate * a.duration)
        end = start + a.duration + 0.5
        sent = 0
        while sent < total and time.monotonic() < end:
            due = min(total, (time.monotonic_ns() - start_ns) // interval_ns + 1)
            while sent < due:
                key = (start_ns + sent * interval_ns).to_bytes(8, "big")
                try:
                    p.produce(a.topic, self._value(sent), key, partition=sent % a.partitions)
                except BufferError:
                    p.poll(0.001)
                    break
                sent += 1
            wait_ns = start_ns + sent * interval_ns - time.monotonic_ns()
            p.poll(max(0.001, wait_ns / 1e9))  # >= 1 ms: librdkafka rounds down to ms
        return sent

    def _max(self, p: Any, start: float) -> int:
        a = self.args
        deadline = start + a.duration
        sent = 0
        while time.monotonic() < deadline:
            for _ in range(1000):
                key = time.monotonic_ns().to_bytes(8, "big")
                try:
                    p.produce(a.topic, self._value(sent), key, partition=sent % a.partitions)
                except BufferError:
                    p.poll(0.002)
                    break
                sent += 1
            p.poll(0)
        return sent


def consume(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": args.bootstrap, **CONSUMER_CONFIG})
    expected: list[int] = []

    def read_stdin() -> None:
        line = sys.stdin.readline()
        if line.strip():
            expected.append(int(line))

    try:
        tps = []
        total = 0
        for p in range(args.partitions):
            low, high = c.get_watermark_offsets(TopicPartition(args.topic, p), timeout=15)
            tps.append(TopicPartition(args.topic, p, high if args.from_end else OFFSET_BEGINNING))
            total += high - low
    except KafkaException as e:
        c.close()
        return {"error": f"list offsets: {e}"}
    if args.expect is not None:
        expected.append(args.expect)
    elif not args.from_end:
        expected.append(total)
    c.assign(tps)
    threading.Thread(target=read_stdin, daemon=True).start()
    print("ready", flush=True)
    n = nbytes = errors = 0
    first_error = ""
    latencies: list[int] = []
    start = time.monotonic()
    timeline = Timeline(start)
    first = last = max_gap = 0.0
    deadline = start + args.duration
    while time.monotonic() < deadline:
        # what librdkafka already holds, at once; else wait for the next record (a batch
        # consume with a timeout would hold early records back until the timeout ends)
        msgs = c.consume(10_000, 0)
        if not msgs:
            m = c.poll(0.1)
            msgs = [m] if m is not None else []
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        got = got_bytes = 0
        for m in msgs:
            if m.error() is not None:
                errors += 1
                first_error = first_error or str(m.error())
                continue
            got += 1
            got_bytes += len(m.value() or b"") + 8
            if args.from_end and len(latencies) < MAX_LATENCY_SAMPLES:
                latencies.append(now_ns - int.from_bytes(m.key() or bytes(8), "big"))
        if got:
            first = first or now
            max_gap = max(max_gap, now - last) if last else 0.0
            last = now
            n += got
            nbytes += got_bytes
            timeline.add(now, got, got_bytes)
        if expected and n >= expected[0]:
            break
        if expected and last and now - last > IDLE_STOP_S:
            break
        if expected and not last and now - start > args.duration / 2:
            break
    c.close()
    elapsed = max(last - start, 1e-9)
    return {
        "records": n,
        "bytes": nbytes,
        "expected": expected[0] if expected else None,
        "errors": errors,
        "first_error": first_error,
        "elapsed_s": elapsed,
        "mib_s": nbytes / elapsed / 2**20,
        "rec_s": n / elapsed,
        "max_gap_s": max_gap,
        "latency_ns": sorted(latencies),
        "timeline": timeline.series(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["produce", "consume"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rate", type=float, default=0.0, help="records/s; 0 = as fast as possible")
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--flush-timeout", type=float, default=30.0)
    ap.add_argument("--json-values", action="store_true")
    ap.add_argument("--record-acks", action="store_true")
    ap.add_argument("--from-end", action="store_true")
    ap.add_argument("--expect", type=int, help="records to read (default: from the watermarks)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = ProduceRun(args).run() if args.mode == "produce" else consume(args)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["client_cpu_s"] = usage.ru_utime + usage.ru_stime
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
