"""The records every client test produces and the check that they came back intact.

Each client test produces `expected_records(n, partitions)` (keyed, with headers and explicit
CreateTime timestamps), consumes the topic back with the same client, and hands what it read
to `check_consumed`, which compares keys, values, headers, timestamps and per-partition order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BASE_TS_MS = 1_700_000_000_000


@dataclass(frozen=True)
class Rec:
    partition: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def expected_records(n: int, partitions: int, tag: str = "") -> list[Rec]:
    """n records spread round-robin over the partitions, explicit partition for each."""
    out = []
    for i in range(n):
        value = (f"value-{tag}-{i}-" + "x" * (i % 97)).encode()
        out.append(
            Rec(
                partition=i % partitions,
                key=f"key-{tag}-{i}".encode(),
                value=value,
                headers=(("seq", str(i).encode()), ("codec", tag.encode())),
                timestamp_ms=BASE_TS_MS + i,
            )
        )
    return out


def check_consumed(expected: list[Rec], consumed: list[Consumed]) -> None:
    """Every produced record exactly once, in per-partition produce order, with offsets dense."""
    assert len(consumed) == len(expected), f"consumed {len(consumed)} of {len(expected)}"
    want: dict[int, list[Rec]] = defaultdict(list)
    got: dict[int, list[Consumed]] = defaultdict(list)
    for r in expected:
        want[r.partition].append(r)
    for c in consumed:
        got[c.partition].append(c)
    assert sorted(want) == sorted(got)
    for p, recs in want.items():
        seen = sorted(got[p], key=lambda c: c.offset)
        offsets = [c.offset for c in seen]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"gap in p{p}"
        for w, c in zip(recs, seen, strict=True):
            assert c.key == w.key
            assert c.value == w.value
            assert tuple(c.headers) == w.headers
            assert c.timestamp_ms == w.timestamp_ms
