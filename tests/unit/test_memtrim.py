"""broker/memtrim.py on this machine's glibc: malloc_trim gives freed heap pages back (the
broker's peak RSS, issue 17), the trimmer calls it off the event loop on its interval, and
the arena cap and the pinned mmap and trim thresholds apply. What must hold: freed heap memory
leaves the process after a trim (RSS drops), large blocks leave it when freed once the
threshold is pinned, even after a larger block was freed, a block freed at the heap's top is
used again without its pages faulted in anew once the trim threshold is pinned, and the event
loop keeps running while trims run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from broker.memtrim import MemoryTrimmer, malloc_trim

FRAGMENT = textwrap.dedent(
    """
    import ctypes, json, sys
    from broker.memtrim import fix_mmap_threshold, limit_arenas, malloc_trim

    def rss_mib():
        with open("/proc/self/status") as f:
            line = next(l for l in f if l.startswith("VmRSS"))
        return int(line.split()[1]) / 1024

    arenas = limit_arenas()
    pinned = fix_mmap_threshold() if sys.argv[1] == "pinned" else False
    big = bytearray(16 << 20); del big  # unpinned, glibc raises its threshold to 16 MiB
    blocks = [bytearray(1 << 20) for _ in range(256)]  # 1 MiB: from the heap unless pinned
    for b in blocks:
        b[::4096] = b"x" * len(b[::4096])  # touch every page
    full = rss_mib()
    del blocks[::2]  # 128 MiB freed: holes inside the heap (still resident) unless pinned
    before = rss_mib()
    released = malloc_trim()() if sys.argv[1] == "trim" else False
    after = rss_mib()
    print(json.dumps({"full": full, "before": before, "after": after, "released": released,
                      "arenas": arenas, "pinned": pinned}))
    """
)


def _run(mode: str) -> dict[str, float]:
    """FRAGMENT in a fresh interpreter (glibc's malloc state is per process); MALLOC_* taken
    out of the environment, which would override the mallopt calls."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", FRAGMENT, mode], capture_output=True,
                         text=True, timeout=60, check=True, env=env)
    result: dict[str, float] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(malloc_trim() is None, reason="needs glibc (malloc_trim)")
def test_a_trim_gives_the_freed_heap_pages_back() -> None:
    kept = _run("none")
    trimmed = _run("trim")
    assert trimmed["arenas"]  # mallopt(M_ARENA_MAX) took
    # 128 MiB freed inside the heap: without a trim it stays resident, with one it leaves
    assert kept["before"] > kept["full"] - 16 and kept["after"] > kept["before"] - 16, kept
    assert trimmed["released"] and trimmed["after"] < trimmed["before"] - 96, trimmed


@pytest.mark.skipif(malloc_trim() is None, reason="needs glibc (mallopt)")
def test_with_the_threshold_pinned_large_blocks_leave_when_freed() -> None:
    pinned = _run("pinned")
    assert pinned["pinned"], pinned  # mallopt(M_MMAP_THRESHOLD) took
    # the same 128 MiB freed, no trim: each 1 MiB block was its own mapping, unmapped on free
    assert pinned["before"] < pinned["full"] - 96, pinned


# what the null engine did with every request of just under 1 MiB (received in chunks,
# joined, freed with nothing allocated after it surviving): with only the mmap threshold
# pinned, glibc shrank the heap at each free and faulted the pages in again at the next
TOP_OF_HEAP = textwrap.dedent(
    """
    import json, os, resource, sys
    from broker.memtrim import fix_mmap_threshold, fix_trim_threshold, limit_arenas

    limit_arenas()
    pinned = fix_mmap_threshold()
    trim = fix_trim_threshold() if sys.argv[1] == "pinned" else False

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    before = faults()
    for _ in range(50):
        chunks = [os.urandom(16) * 16383 for _ in range(4)]  # ~256 KiB each
        frame = b"".join(chunks)  # ~1 MiB, below the mmap threshold: from the heap's top
        del chunks, frame
    print(json.dumps({"faults": faults() - before, "pinned": pinned, "trim": trim}))
    """
)


@pytest.mark.skipif(malloc_trim() is None, reason="needs glibc (mallopt)")
def test_with_the_trim_threshold_pinned_the_heap_top_is_reused_not_faulted_again() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def run(mode: str) -> dict[str, int]:
        out = subprocess.run([sys.executable, "-c", TOP_OF_HEAP, mode], capture_output=True,
                             text=True, timeout=60, check=True, env=env)
        result: dict[str, int] = json.loads(out.stdout)
        return result

    shrinking, kept = run("default"), run("pinned")
    assert shrinking["pinned"] and kept["pinned"] and kept["trim"], kept
    # 50 frames of 256 pages: shrunk and grown again each time without the pin (~9,000
    # faults here), the same pages reused with it (~750, the first frames' growth)
    assert shrinking["faults"] > 5000, shrinking
    assert kept["faults"] < 2000, kept


async def test_the_trimmer_runs_on_its_interval_off_the_event_loop() -> None:
    real = malloc_trim()
    threads: list[str] = []

    def trim() -> bool:
        threads.append(threading.current_thread().name)
        return real() if real is not None else False

    trimmer = MemoryTrimmer(20, trim)
    task = asyncio.create_task(trimmer.run())
    ticks = 0
    try:
        for _ in range(100):  # the loop goes on meanwhile
            await asyncio.sleep(0.005)
            ticks += 1
            if trimmer.runs >= 3:
                break
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert trimmer.runs >= 3 and ticks >= 3
    assert threading.main_thread().name not in threads  # never on the event loop's thread
    runs = sum(s.value for m in trimmer.collect() for s in m.samples
               if s.name == "floe_memory_trim_runs_total")
    assert runs == trimmer.runs


def _python(code: str, env: dict[str, str] | None = None) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, env={**base, **(env or {})}).stdout.split()


@pytest.mark.parametrize("env", ["", "mimalloc"])
@pytest.mark.parametrize("imported", [False, True])
def test_pyarrow_allocates_with_jemalloc(env: str, imported: bool) -> None:
    """arrow_pool: pyarrow's default pool becomes jemalloc, which gives freed pages back at
    once (what the table writers free leaves the process), before pyarrow is imported for
    Arrow C++ too (the variable it reads), unless the operator's ARROW_DEFAULT_MEMORY_POOL
    decides; a second call keeps the first decision."""
    code = ("import os, sys\n"
            + ("import pyarrow\n" if imported else "")
            + "from broker.memtrim import arrow_pool\n"
            "took = arrow_pool(), arrow_pool()\n"
            "import pyarrow as pa\n"
            "print(*took, pa.default_memory_pool().backend_name,"
            " os.environ.get('ARROW_DEFAULT_MEMORY_POOL', '-'))")
    out = _python(code, {"ARROW_DEFAULT_MEMORY_POOL": env} if env else {})
    if env:
        assert out == ["False", "False", env, env], out
    else:
        assert out == ["True", "True", "jemalloc", "-" if imported else "jemalloc"], out


def test_a_pyarrow_without_jemalloc_allocates_with_malloc() -> None:
    """Where pyarrow has no jemalloc (Arrow C++ then keeps its own default, mimalloc),
    check_arrow_pool makes pyarrow's default the system pool, not mimalloc."""
    code = ("import pyarrow as pa\n"
            "def none(): raise NotImplementedError('no jemalloc here')\n"
            "pa.jemalloc_memory_pool = none\n"
            "from broker.memtrim import arrow_pool\n"
            "print(arrow_pool(), pa.default_memory_pool().backend_name)")
    assert _python(code) == ["True", "system"]


def test_the_lazy_import_of_pyarrow_checks_the_pool() -> None:
    """tabletopic.lazyload, importing pyarrow for the first time, runs check_arrow_pool:
    here Arrow C++ was told mimalloc after arrow_pool chose (as when jemalloc is missing),
    and pyarrow still allocates with jemalloc."""
    code = ("import asyncio, os\n"
            "from broker.memtrim import arrow_pool\n"
            "arrow_pool()\n"
            "os.environ['ARROW_DEFAULT_MEMORY_POOL'] = 'mimalloc'\n"
            "from tabletopic import lazyload\n"
            "asyncio.run(lazyload.load('pyarrow'))\n"
            "import pyarrow as pa\n"
            "print(pa.default_memory_pool().backend_name)")
    assert _python(code) == ["jemalloc"]
