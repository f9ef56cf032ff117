"""Giving the heap's free pages back to the operating system (`memory.trim.interval.ms`).

The broker's large buffers (WAL appends, cached chunks, fetch responses) are allocated and
freed all the time. glibc's malloc serves blocks of that size from the heap once a large
block has been freed (its mmap threshold grows to the largest freed block, up to 32 MiB), and
free pages inside the heap stay in the process: after a gigabyte produced and read back a
broker held 779 MiB of which ~340 MiB were free heap pages (benchmarks/README.md).
`malloc_trim(0)` hands every whole free page back (madvise), in every arena.

What it buys, measured (15 s max-rate produce then a full read back, 2 vCPUs): the steady
state after the burst (555 MiB without, 315-395 with), not the peak while busy (pages freed
are allocated again within any interval: 555 MiB without, 554 every 250 ms, 494 every 50 ms),
and a page given back costs a page fault when used again (every 250 ms: produce CPU 2.3
against 1.8 s/GiB). Hence 5 s by default: memory back after bursts, no measurable cost.

It runs every `memory.trim.interval.ms` in a worker thread: ctypes releases the GIL around
the call, so the event loop goes on (it only waits for an arena's lock should it allocate
from the arena being trimmed). 0 turns it off. On a C library without malloc_trim (musl,
macOS) a value set by the operator is refused at start; the default then does nothing.

`limit_arenas` caps glibc at ARENAS malloc arenas (unless MALLOC_ARENA_MAX is set): by
default each thread that allocates (object-store reads and fsyncs in worker threads, the
metadata store's thread) may get an arena of its own (up to 8 per core), each keeping its own
freed pages; the threads here hold the GIL while they allocate, so they gain nothing from
separate arenas.

`fix_mmap_threshold` pins glibc's mmap threshold at MMAP_THRESHOLD (unless
MALLOC_MMAP_THRESHOLD_ is set): every block from that size up is its own mapping, handed back
to the system the moment it is freed, instead of a hole in the heap that only a trim returns.
glibc raises the threshold by itself to the largest block freed so far (up to 32 MiB), so
without the pin, once the first WAL object or fetch response is freed, every large buffer
after it comes from the heap. Measured (max-1k-16p: 15 s of max-rate produce then a warm
read back, compaction running; file store, 2 vCPUs, runs alternated): broker peak 448-592
MiB unpinned (6 runs), 444-452 at 512 KiB (3), 450-458 at 256 KiB (5), 511-516 at 1 MiB
(2); produce CPU 3.6-4.6 s/GiB unpinned, 3.7-5.1 at 512 KiB, 4.5-5.5 at 256 KiB (each
block mapped anew costs its page faults), 3.3-3.5 at 1 MiB. Later, with the WAL's memory
bounded (s3stream/wal.py): pinned 139/181 MiB/s of produce (5.3/4.2 s/GiB) against 168/201
(4.1/3.5) with MALLOC_MMAP_THRESHOLD_=32 MiB, 2 pairs; whole-run peak 423-424 MiB at 512
KiB, 470-472 at 1 MiB. The price: up to ~15% of max-rate produce CPU. Once a broker without
table topics no longer imported pyarrow (~100 MiB less RSS), the pin went from 512 KiB to
1 MiB. Max-rate produce, 15 s, 16 partitions, runs alternated: S3 (moto) 8.5/8.9 CPU s
against 10.3/10.6 at 512 KiB for 80-96 MiB/s; the file store 3 pairs, 3.43/3.10/3.16 s/GiB
(166/180/176 MiB/s, RSS 231-236 MiB) against 3.79/3.62/3.14 (160/170/194, RSS 256-286); the
100-partition produce and warm read peaked at 386-415 MiB against 400-418; a full run at
1 MiB peaked at 430 (benchmarks/README.md).

`fix_trim_threshold` pins glibc's trim threshold at TRIM_THRESHOLD (unless
MALLOC_TRIM_THRESHOLD_ is set). Pinning the mmap threshold also stops glibc from raising its
trim threshold, which stays at 128 KiB: whenever a block freed at the top of the heap leaves
more than that free there, free() shrinks the heap at once, and the next block allocated
there faults its pages in again. A request of just under 1 MiB (librdkafka's largest at
max rate) is such a block when nothing allocated after it outlives it: the null engine took
~300 page faults per MiB produced, 1.1-1.2 s/GiB of system CPU (max-1k-16p, 10 s, 2 pairs:
2.43/2.88 s/GiB in all), against 20-34 faults, 0.37-0.40 s/GiB of system CPU (1.93/2.04 in
all) with the threshold at 4 MiB. The file store, whose WAL keeps what it is sent until the
flush, took 29-35 faults per MiB either way (3 pairs, within the noise). What the heap keeps
free above the threshold still leaves on the trimmer's interval (at most TRIM_THRESHOLD per
arena in between).

`arrow_pool` makes pyarrow allocate with jemalloc, as Arrow configures it (dirty pages go back
to the system as they are freed: decay 0), unless ARROW_DEFAULT_MEMORY_POOL is set; where this
pyarrow has no jemalloc, with glibc's malloc. pyarrow's own default, mimalloc, keeps what the
table writers' conversions and Parquet writes free for reuse. Measured (benchmarks.tablebacklog
--seconds 6: 230-420k JSON rows caught up into a table, runs alternated): broker peak 465-508
MiB with mimalloc, 357-391 with the system pool; catch-up 113-130k against 102-128k rows/s.
Then jemalloc against the system pool (7 pairs, 2 vCPUs): 149k against 135k rows/s mean
(4 pairs), broker CPU 7.6 against 8.5 us per row, peak 383-431 against 362-403 MiB: with
malloc and the 1 MiB mmap pin every column buffer past 1 MiB is mapped anew (its pages
faulted in, then unmapped), which jemalloc's extents avoid; in-process, converting JSON rows
to Arrow 1.80 against 2.27 us/row, Parquet writes of 4 partitions at once 0.64 against 0.89.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
ARENAS = 2
MMAP_THRESHOLD = 1024 * 1024
TRIM_THRESHOLD = 4 * 1024 * 1024
M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _mallopt(param: int, value: int, env: str) -> bool:
    libc = _libc()
    if libc is None or env in os.environ or not hasattr(libc, "mallopt"):
        return False
    fn = libc.mallopt
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return bool(fn(param, value))


def limit_arenas(n: int = ARENAS) -> bool:
    """mallopt(M_ARENA_MAX, n), before the broker starts its threads; False where there is
    no glibc mallopt or MALLOC_ARENA_MAX already decides."""
    return _mallopt(M_ARENA_MAX, n, "MALLOC_ARENA_MAX")


def fix_mmap_threshold(n: int = MMAP_THRESHOLD) -> bool:
    """mallopt(M_MMAP_THRESHOLD, n): blocks of n bytes and more are mapped on their own and
    unmapped when freed; False where there is no glibc mallopt or MALLOC_MMAP_THRESHOLD_
    already decides."""
    return _mallopt(M_MMAP_THRESHOLD, n, "MALLOC_MMAP_THRESHOLD_")


def fix_trim_threshold(n: int = TRIM_THRESHOLD) -> bool:
    """mallopt(M_TRIM_THRESHOLD, n): the heap shrinks by itself only once n bytes are free
    at its top (the trimmer gives back the rest on its interval); False where there is no
    glibc mallopt or MALLOC_TRIM_THRESHOLD_ already decides."""
    return _mallopt(M_TRIM_THRESHOLD, n, "MALLOC_TRIM_THRESHOLD_")


ARROW_POOL = "jemalloc"
_arrow_pool: bool | None = None  # what arrow_pool decided, once


def arrow_pool() -> bool:
    """pyarrow (and the Arrow C++ code under it: Parquet writing) on jemalloc; False where
    the operator's ARROW_DEFAULT_MEMORY_POOL decides. Arrow C++ reads that variable once, at
    its first allocation: called before pyarrow is imported (`floe broker` does), it sets
    the variable, and `check_arrow_pool` (once pyarrow is imported) falls back to the system
    pool where this pyarrow has no jemalloc (Arrow C++ then keeps its own default and says
    so); afterwards only pyarrow's own default can change, not what C++ allocates by itself.
    The same call again keeps the first decision."""
    global _arrow_pool
    if _arrow_pool is None:
        _arrow_pool = "ARROW_DEFAULT_MEMORY_POOL" not in os.environ
        if _arrow_pool and "pyarrow" not in sys.modules:
            os.environ["ARROW_DEFAULT_MEMORY_POOL"] = ARROW_POOL
        elif _arrow_pool:
            check_arrow_pool()
    return _arrow_pool


def check_arrow_pool() -> None:
    """Once pyarrow is imported: where `arrow_pool` chose jemalloc and Arrow C++ did not take
    it, pyarrow's default becomes jemalloc, or the system pool where this pyarrow has none."""
    import pyarrow as pa

    if _arrow_pool and pa.default_memory_pool().backend_name != ARROW_POOL:
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a build without jemalloc
            log.warning("this pyarrow has no jemalloc: it allocates with malloc (Arrow C++'s"
                        " own allocations with its default pool)")
            pa.set_memory_pool(pa.system_memory_pool())


def malloc_trim() -> Callable[[], bool] | None:
    """glibc's malloc_trim(0) (True: memory was released), or None where there is none."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None) if libc is not None else None
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: bool(fn(0))


class MemoryTrimmer(Collector):
    """Calls `trim` every `interval_ms` off the event loop; counts runs and their time."""

    def __init__(self, interval_ms: int, trim: Callable[[], bool]) -> None:
        self.interval_ms = interval_ms
        self.trim = trim
        self.runs = 0
        self.released = 0  # runs that gave memory back
        self.seconds = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            began = time.perf_counter()
            released = await asyncio.to_thread(self.trim)
            self.seconds += time.perf_counter() - began
            self.runs += 1
            self.released += released

    def collect(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "floe_memory_trim_runs",
            "malloc_trim calls (memory.trim.interval.ms), by whether memory was released",
            labels=["released"],
        )
        runs.add_metric(["true"], self.released)
        runs.add_metric(["false"], self.runs - self.released)
        yield runs
        yield CounterMetricFamily(
            "floe_memory_trim_seconds", "time spent in malloc_trim", value=self.seconds
        )
