"""The official Apache Kafka Java client (kafka-clients 3.9) against a real floe broker.

The client is driven by the single-file program java/FloeClientCheck.java, launched with
`java -cp $FLOE_JAVA_CLASSPATH FloeClientCheck.java ...` (no javac step). `./dev test` extracts
the jars into .cache/java/lib and exports FLOE_JAVA_CLASSPATH; unset, the same directory under
the repository root is used. The tests skip only when `java` or the kafka-clients jar is missing.

Put an slf4j binding (e.g. slf4j-simple 1.7.x) on FLOE_JAVA_CLASSPATH to see the client's own
WARN/ERROR log lines in the failure output.
"""

from __future__ import annotations

import base64
import glob
import os
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess
from tests.integration.workload import (
    BASE_TS_MS,
    CODECS,
    Consumed,
    Rec,
    check_consumed,
    expected_records,
)

pytestmark = [pytest.mark.integration, pytest.mark.java]

REPO_ROOT = Path(__file__).resolve().parents[2]
JAVA_PROGRAM = Path(__file__).resolve().parent / "java" / "FloeClientCheck.java"
N_RECORDS = 10_000
PARTITIONS = 3
TIMEOUT_S = 120.0


def java_classpath() -> str:
    return os.environ.get("FLOE_JAVA_CLASSPATH") or str(REPO_ROOT / ".cache" / "java" / "lib" / "*")


def _classpath_has_kafka_clients(classpath: str) -> bool:
    for entry in filter(None, classpath.split(os.pathsep)):
        if entry.endswith("*"):
            jars = glob.glob(entry[:-1] + "*.jar")
        else:
            jars = [entry] if Path(entry).is_file() else []
        if any(Path(j).name.startswith("kafka-clients") for j in jars):
            return True
    return False


JAVA = shutil.which("java")
if JAVA is None:
    pytest.skip("`java` is not installed", allow_module_level=True)
if not _classpath_has_kafka_clients(java_classpath()):
    pytest.skip(
        f"no kafka-clients jar on FLOE_JAVA_CLASSPATH ({java_classpath()}); run ./dev test",
        allow_module_level=True,
    )


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_java(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    assert JAVA is not None
    cmd = [
        JAVA,
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        java_classpath(),
        str(JAVA_PROGRAM),
        broker.bootstrap,
        *args,
    ]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"Java client {' '.join(args)} timed out after {TIMEOUT_S:.0f}s\n"
            f"--- java stderr ---\n{_tail(_text(e.stderr))}\n"
            f"--- java stdout ---\n{_tail(_text(e.stdout), 20)}\n"
            f"--- broker log ---\n{_tail(broker.log())}"
        )


def _failure_context(proc: subprocess.CompletedProcess[str], broker: BrokerProcess) -> str:
    return (
        f"exit status {proc.returncode}\n"
        f"--- java stderr ---\n{_tail(proc.stderr, 120)}\n"
        f"--- broker log ---\n{_tail(broker.log())}"
    )


def _unb64(field_: str) -> bytes | None:
    return None if field_ == "-" else base64.b64decode(field_)


@dataclass
class RoundtripOutput:
    consumed: dict[str, list[Consumed]] = field(default_factory=lambda: defaultdict(list))
    timestamp_types: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # codec -> seq -> (partition, offset, timestamp) from the producer's RecordMetadata
    acks: dict[str, dict[int, tuple[int, int, int]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    done: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def parse_roundtrip(stdout: str) -> RoundtripOutput:
    out = RoundtripOutput()
    for line in stdout.splitlines():
        kind, _, rest = line.partition("\t")
        f = rest.split("\t")
        if kind == "REC":
            tag, part, offset, ts, ts_type, key, value, headers = f
            hdrs = []
            for h in filter(None, headers.split(",")):
                hk, hv = h.split(":")
                hk_bytes = _unb64(hk)
                assert hk_bytes is not None
                hdrs.append((hk_bytes.decode(), _unb64(hv)))
            out.consumed[tag].append(
                Consumed(
                    partition=int(part),
                    offset=int(offset),
                    key=_unb64(key),
                    value=_unb64(value),
                    headers=tuple(hdrs),
                    timestamp_ms=int(ts),
                )
            )
            out.timestamp_types[tag].add(ts_type)
        elif kind == "ACK":
            tag, seq, part, offset, ts = f
            out.acks[tag][int(seq)] = (int(part), int(offset), int(ts))
        elif kind == "DONE":
            tag, produced, consumed = f
            out.done[tag] = (int(produced), int(consumed))
        elif kind == "ERROR":
            tag, exc, msg = f
            out.errors[tag] = f"{exc}: {msg}"
    return out


def _describe_mismatch(expected: list[Rec], consumed: list[Consumed]) -> str:
    """check_consumed's plain asserts carry no values: name the first differing record."""
    want: dict[int, list[Rec]] = defaultdict(list)
    got: dict[int, list[Consumed]] = defaultdict(list)
    for r in expected:
        want[r.partition].append(r)
    for c in consumed:
        got[c.partition].append(c)
    lines = [
        f"per-partition counts: expected { {p: len(v) for p, v in sorted(want.items())} }, "
        f"consumed { {p: len(v) for p, v in sorted(got.items())} }"
    ]
    for p in sorted(want):
        seen = sorted(got.get(p, []), key=lambda c: c.offset)
        for i, (w, c) in enumerate(zip(want[p], seen, strict=False)):
            if (c.key, c.value, tuple(c.headers), c.timestamp_ms) != (
                w.key,
                w.value,
                w.headers,
                w.timestamp_ms,
            ):
                lines.append(f"p{p} #{i}: expected {w}\n      consumed {c}")
                break
    return "\n".join(lines)


def check_codec(codec: str, out: RoundtripOutput) -> None:
    assert codec not in out.errors, f"Java client failed: {out.errors[codec]}"
    assert out.done.get(codec, (None, None))[0] == N_RECORDS, f"no DONE line for {codec}"
    expected = expected_records(N_RECORDS, PARTITIONS, tag=codec)
    consumed = out.consumed[codec]
    try:
        check_consumed(expected, consumed)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_describe_mismatch(expected, consumed)}") from None
    assert out.timestamp_types[codec] == {"CreateTime"}, out.timestamp_types[codec]
    # the offsets/timestamps the producer was acknowledged with are the ones read back
    read_at = {c.key: (c.partition, c.offset, c.timestamp_ms) for c in consumed}
    acks = out.acks[codec]
    assert len(acks) == N_RECORDS
    for i, rec in enumerate(expected):
        assert acks[i] == read_at[rec.key], (
            f"record {i}: acknowledged (partition, offset, ts) {acks[i]}, "
            f"read back at {read_at[rec.key]}"
        )


@pytest.mark.slow
def test_produce_consume_all_codecs(broker: BrokerProcess) -> None:
    """10,000 keyed records with headers per codec, acks=all, read back with assign()."""
    proc = run_java(broker, "roundtrip-all", str(N_RECORDS), "java-rt", *CODECS)
    out = parse_roundtrip(proc.stdout)
    failures = {}
    for codec in CODECS:
        try:
            check_codec(codec, out)
        except AssertionError as e:
            failures[codec] = str(e)
    if failures or proc.returncode != 0:
        report = "\n".join(f"[{c}] {msg}" for c, msg in failures.items())
        pytest.fail(
            f"codecs failing: {sorted(failures)}\n{report}\n{_failure_context(proc, broker)}"
        )


def parse_admin(stdout: str) -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = defaultdict(list)
    for line in stdout.splitlines():
        kind, *rest = line.split("\t")
        out[kind].append(rest)
    return out


def test_admin_and_offsets_for_times(broker: BrokerProcess) -> None:
    topic = "java-admin"
    proc = run_java(broker, "admin", topic)
    assert proc.returncode == 0, _failure_context(proc, broker)
    out = parse_admin(proc.stdout)

    assert out["CREATED"] == [[topic]]
    assert out["CREATE_AGAIN"] == [["TopicExistsException"]]

    # name -> (value, source, read-only)
    before = {name: (value, source) for name, value, source, _ro in out["CONFIG"]}
    assert before.get("retention.ms") == ("3600000", "DYNAMIC_TOPIC_CONFIG"), before
    assert before.get("cleanup.policy") == ("delete", "DYNAMIC_TOPIC_CONFIG"), before
    assert before.get("max.message.bytes") == ("2097152", "DYNAMIC_TOPIC_CONFIG"), before

    assert out["ALTERED"] == [[topic]]
    after = {name: (value, source) for name, value, source, _ro in out["CONFIG_ALTERED"]}
    assert after.get("retention.ms") == ("7200000", "DYNAMIC_TOPIC_CONFIG"), after
    # incremental: keys not named in the request keep their topic-level values
    assert after.get("cleanup.policy") == ("delete", "DYNAMIC_TOPIC_CONFIG"), after
    # DELETE drops the topic override; the entry falls back to a (non-topic) default
    assert "max.message.bytes" in after, after
    assert after["max.message.bytes"][1] != "DYNAMIC_TOPIC_CONFIG", after
    assert after["max.message.bytes"][0] != "2097152", after

    assert out["PARTITIONS"] == [[topic, "4"]]

    topics_before = out["TOPICS_BEFORE"][0][0].split(",")
    assert topic in topics_before and f"{topic}-ts" in topics_before, topics_before
    topics_after = out["TOPICS_AFTER"][0][0].split(",")
    assert topic not in topics_after, topics_after
    assert f"{topic}-ts" in topics_after, topics_after

    # TOPIC-ts holds offsets 0..9 with CreateTime BASE_TS_MS + 1000 * offset
    def at(offset: int) -> list[str]:
        return [str(offset), str(BASE_TS_MS + 1000 * offset)]

    lookups = {q: rest for q, *rest in out["OFFSET_FOR_TIME"]}
    assert lookups == {
        str(BASE_TS_MS - 5000): at(0),
        str(BASE_TS_MS): at(0),
        str(BASE_TS_MS + 3500): at(4),
        str(BASE_TS_MS + 9000): at(9),
        str(BASE_TS_MS + 9001): ["null", "null"],
    }, lookups
    assert out["BEGINNING"] == [["0"]]
    assert out["END"] == [["10"]]
    list_offsets = {spec: rest for spec, *rest in out["LIST_OFFSETS"]}
    assert list_offsets["earliest"][0] == "0", list_offsets
    assert list_offsets["latest"][0] == "10", list_offsets
    assert list_offsets[f"ts{BASE_TS_MS + 3500}"] == at(4), list_offsets
