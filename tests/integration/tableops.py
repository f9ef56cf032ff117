"""Helpers of the table-operation tests (test_table_ops.py, test_table_drill.py): the `floe
table` CLI run in-process against a real broker's admin port, table reads, waits."""

from __future__ import annotations

import contextlib
import io
import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from broker.cli import main as floe
from tests.integration.test_table_topic import catalog, table_rows


def cli(admin: str, *args: str) -> tuple[int, str, str]:
    """Run `floe table ARGS --metrics ADMIN`; (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = floe(["table", *args, "--metrics", admin])
    return code, out.getvalue(), err.getvalue()


def cli_json(admin: str, *args: str) -> dict[str, Any]:
    code, out, err = cli(admin, *args, "--json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def status(admin: str, topic: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{admin}/status", timeout=10) as r:
        doc = json.loads(r.read())
    (t,) = [t for t in doc["tables"] if t["topic"] == topic]
    found: dict[str, Any] = t
    return found


def produce(bootstrap: str, topic: str, docs: list[dict[str, Any] | bytes], partitions: int
            ) -> dict[tuple[int, int], bytes]:
    """Each doc as JSON (bytes as they are) to partition i % partitions; {(p, o): value}."""
    acked: dict[tuple[int, int], bytes] = {}

    def done(err: object, msg: Any) -> None:
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i, d in enumerate(docs):
        value = d if isinstance(d, bytes) else json.dumps(d).encode()
        p.produce(topic, value, partition=i % partitions, on_delivery=done)
    assert p.flush(30) == 0
    assert len(acked) == len(docs)
    return acked


def keys(rows: list[dict[str, Any]]) -> Counter[tuple[int, int]]:
    return Counter((r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in rows)


def wait_keys(data_dir: Path, topic: str, want: set[tuple[int, int]], timeout: float = 30.0
              ) -> list[dict[str, Any]]:
    """Until the table holds exactly `want`, each once (AssertionError with the difference)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = table_rows(data_dir, topic)
        got = keys(rows)
        if set(got) == want and max(got.values(), default=1) == 1:
            return rows
        if time.monotonic() > deadline:
            dupes = sorted(k for k, n in got.items() if n > 1)[:5]
            raise AssertionError(
                f"table {topic}: {len(got)} keys, want {len(want)}; missing "
                f"{sorted(want - set(got))[:5]}, extra {sorted(set(got) - want)[:5]}, "
                f"duplicates {dupes}"
            )
        time.sleep(0.3)


def current_snapshot(data_dir: Path, topic: str) -> int:
    sid = catalog(data_dir).load_table(("default", topic)).metadata.current_snapshot_id
    assert sid is not None
    return sid


def alter(bootstrap: str, topic: str, cfg: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in cfg.items()
    ])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(10)


def wait_status(admin: str, topic: str, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ValueError, OSError, LookupError):  # Lookup: not there yet
            s = status(admin, topic)
            if pred(s):
                return s
        if time.monotonic() > deadline:
            raise AssertionError(f"status of {topic} never matched: {status(admin, topic)}")
        time.sleep(0.2)
