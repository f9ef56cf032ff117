"""Plain counters that the storage layer bumps on its hot paths, read by the broker's metrics
collector at scrape time (`broker/metrics.py`).

s3stream knows nothing of Prometheus: each counter here is an attribute increment or one
`bisect` into a short list, with no lock (everything runs on the event loop's thread, except
that a histogram may be observed from a worker thread, where a lost increment under a race is
tolerated: these are statistics, not accounting). A scrape reads them as they are.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

# seconds: 1 ms .. 30 s, the range of a local fsync up to a slow S3 PUT with retries
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
# bytes: 1 KiB .. 64 MiB, powers of 4
SIZE_BUCKETS: tuple[float, ...] = tuple(float(1024 * 4**i) for i in range(9))


class Histogram:
    """Counts of observations per bucket (`counts[i]`: observations <= buckets[i] and above
    the previous bound; the last slot: above every bound), their sum and their number."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) for every bound and +Inf, as Prometheus wants."""
        out, total = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass
class LogStats:
    """The WAL flushes of one LogStore (its ChunkCache counts its own hits and misses)."""

    wal_flushes: int = 0
    wal_flush_failures: int = 0
    wal_commits: int = 0  # metadata transactions committing WAL objects (one or more each)
    wal_flush_bytes: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))
    wal_flush_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    room_waits: int = 0  # `room()` calls that had to wait (a producer faster than the store)
    room_wait_seconds: float = 0.0


@dataclass
class OpStats:
    requests: int = 0
    errors: int = 0
    seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))


@dataclass
class ObjectStoreStats:
    """Calls of one object store by operation (PUT, GET, DELETE, LIST), each attempt counted
    (a retried call counts one request per attempt), plus the last outcome for health."""

    ops: dict[str, OpStats] = field(default_factory=dict)
    retries: int = 0
    last_ok_at: float = 0.0  # wall clock of the last successful attempt
    last_error: str = ""  # the last failed attempt's error, "" if none yet
    last_error_at: float = 0.0
    costs: StreamCosts = field(default_factory=lambda: StreamCosts())

    def op(self, name: str) -> OpStats:
        s = self.ops.get(name)
        if s is None:
            s = self.ops[name] = OpStats()
        return s

    def record(self, name: str, seconds: float, error: BaseException | None) -> None:
        s = self.op(name)
        s.requests += 1
        s.seconds.observe(seconds)
        if error is None:
            self.last_ok_at = time.time()
        else:
            s.errors += 1
            self.last_error = f"{name}: {error!r}"[:500]
            self.last_error_at = time.time()


# -- cost attribution ------------------------------------------------------------------------
# An object-store request's share of each stream: set by the code that knows (a WAL flush: its
# streams by their bytes in the object; a partition's read: that stream) around the awaited
# call; tasks started inside inherit it. Stream objects ("stream/<id>/...") name their stream.
ATTRIBUTION: ContextVar[tuple[tuple[int, float], ...] | None] = ContextVar(
    "s3stream_attribution", default=None
)


@contextmanager
def attributed(shares: Iterable[tuple[int, float]]) -> Iterator[None]:
    """Attribute the object-store requests made inside to streams by weight ((stream id,
    weight), e.g. each stream's bytes in a WAL object)."""
    token = ATTRIBUTION.set(tuple(shares))
    try:
        yield
    finally:
        ATTRIBUTION.reset(token)


@dataclass
class Cost:
    """Requests (fractional when an object is shared) and bytes moved of one operation."""

    requests: float = 0.0
    bytes: float = 0.0


@dataclass
class StreamCosts:
    """Successful object-store requests and their bytes (PUT: written, GET: read) per stream
    and operation; a request shared by several streams counts as each stream's fraction of it,
    so the streams' figures add up to the attributed total. `unattributed`: requests no stream
    could be named for (a WAL object deleted once compacted, listings)."""

    streams: dict[int, dict[str, Cost]] = field(default_factory=dict)
    unattributed: dict[str, Cost] = field(default_factory=dict)
    totals: dict[str, Cost] = field(default_factory=dict)

    def record(self, op: str, key: str, nbytes: int) -> None:
        total = self.totals.setdefault(op, Cost())
        total.requests += 1
        total.bytes += nbytes
        shares = ATTRIBUTION.get()
        if shares is None and key.startswith("stream/"):
            named = key.split("/", 2)[1]
            shares = ((int(named), 1.0),) if named.isdigit() else None
        weight = sum(w for _sid, w in shares) if shares else 0.0
        if not shares or weight <= 0:
            c = self.unattributed.setdefault(op, Cost())
            c.requests += 1
            c.bytes += nbytes
            return
        for sid, w in shares:
            c = self.streams.setdefault(sid, {}).setdefault(op, Cost())
            c.requests += w / weight
            c.bytes += nbytes * w / weight
