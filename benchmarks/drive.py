"""Runs one workload against one running system: topic, client processes, broker CPU."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.procs import Processes
from benchmarks.systems import System
from benchmarks.workloads import Workload

CLIENT_SLACK_S = 90.0  # flush and drain time allowed past a workload's duration


@dataclass
class RunResult:
    system: str
    workload: str
    topic: str
    produce: dict[str, Any] = field(default_factory=dict)
    consume: dict[str, Any] = field(default_factory=dict)  # tailing (fixed) or warm read (max)
    broker_cpu_s: float = 0.0  # during the produce phase
    error: str = ""


def create_topic(
    bootstrap: str, topic: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, partitions, 1, config=configs or {})])[topic]
    fut.result(30)


def _client_cmd(mode: str, bootstrap: str, topic: str, out: Path, **opts: Any) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.client", mode, "--bootstrap", bootstrap]
    cmd += ["--topic", topic, "--out", str(out)]
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            cmd.append(flag)
        elif v is not None and v is not False:
            cmd += [flag, str(v)]
    return cmd


def _read(path: Path, proc_tail: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {"error": f"client wrote no result; its log ends:\n{proc_tail}"}


def produce(
    procs: Processes,
    system: System,
    w: Workload,
    topic: str,
    out_dir: Path,
    tail_consumer: bool,
    record_acks: bool = False,
    json_values: bool = False,
    consumer_reads: bool = True,
) -> RunResult:
    """Produce the workload; with `tail_consumer`, a consumer reads along from the end (told
    to expect every acknowledged record, or none when `consumer_reads` is False: a system
    whose Fetch returns no records, as the null engine, still gets the consumer's load)."""
    res = RunResult(system.name, w.name, topic)
    tag = f"{system.name}.{w.name}"
    consumer = None
    if tail_consumer:
        c_out = out_dir / f"{tag}.consume.json"
        cmd = _client_cmd(
            "consume",
            system.bootstrap,
            topic,
            c_out,
            partitions=w.partitions,
            duration=w.duration + CLIENT_SLACK_S,
            from_end=True,
        )
        consumer = procs.start(f"{tag}.consumer", cmd, wait_for="ready", stdin_pipe=True)
    p_out = out_dir / f"{tag}.produce.json"
    cmd = _client_cmd(
        "produce",
        system.bootstrap,
        topic,
        p_out,
        partitions=w.partitions,
        size=w.size,
        rate=w.rate or None,
        duration=w.duration,
        flush_timeout=w.flush_timeout,
        record_acks=record_acks,
        json_values=json_values,
    )
    before = system.sample()
    producer = procs.start(f"{tag}.producer", cmd, wait_for=None)
    if producer.wait(w.duration + CLIENT_SLACK_S) is None:
        res.error = "producer did not finish in time"
    after = system.sample()
    procs.stop(producer)
    res.produce = _read(p_out, producer.tail())
    if before is not None and after is not None:
        res.broker_cpu_s = after.cpu_s - before.cpu_s
    if consumer is not None:
        consumer.send_line(str(res.produce.get("acked", 0) if consumer_reads else 0))
        if consumer.wait(CLIENT_SLACK_S) is None:
            res.error = res.error or "consumer did not finish in time"
        procs.stop(consumer)
        res.consume = _read(c_out, consumer.tail())
    res.error = res.error or res.produce.get("error", "") or res.consume.get("error", "")
    return res


def consume_all(
    procs: Processes,
    system: System,
    topic: str,
    partitions: int,
    expect: int,
    out_dir: Path,
    tag: str,
    timeout_s: float,
) -> tuple[dict[str, Any], float]:
    """Read `expect` records of the topic from the start; (result, broker CPU seconds)."""
    out = out_dir / f"{tag}.json"
    cmd = _client_cmd(
        "consume",
        system.bootstrap,
        topic,
        out,
        partitions=partitions,
        duration=timeout_s,
        expect=expect,
    )
    before = system.sample()
    t0 = time.monotonic()
    consumer = procs.start(tag, cmd, wait_for=None)
    if consumer.wait(timeout_s + 30) is None:
        procs.stop(consumer)
        return {"error": f"consumer still running after {time.monotonic() - t0:.0f} s"}, 0.0
    after = system.sample()
    procs.stop(consumer)
    cpu = after.cpu_s - before.cpu_s if before is not None and after is not None else 0.0
    return _read(out, consumer.tail()), cpu
