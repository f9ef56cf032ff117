"""Small numeric helpers shared by the clients and the report (no third-party imports)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, nearest-rank; NaN if empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 99, 99.9)) -> dict[str, float]:
    s = sorted(values)
    return {f"p{q:g}": percentile(s, q) for q in qs}


class Timeline:
    """Counts (records, bytes) per fixed time bucket since `start` (monotonic seconds)."""

    def __init__(self, start: float, bucket_s: float = 0.25, max_buckets: int = 4800) -> None:
        self.start = start
        self.bucket_s = bucket_s
        self.records = [0] * max_buckets
        self.bytes = [0] * max_buckets

    def add(self, t: float, n: int, nbytes: int) -> None:
        i = int((t - self.start) / self.bucket_s)
        if 0 <= i < len(self.records):
            self.records[i] += n
            self.bytes[i] += nbytes

    def series(self) -> list[tuple[float, float]]:
        """(seconds since start, MiB/s) per bucket, trailing empty buckets dropped."""
        last = max((i for i, r in enumerate(self.records) if r), default=-1)
        return [
            (round((i + 1) * self.bucket_s, 3), self.bytes[i] / self.bucket_s / 2**20)
            for i in range(last + 1)
        ]
