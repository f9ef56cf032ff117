"""Importing the table stack (pyarrow, Parquet, the converters: ~60 MiB and ~0.25 s) only
when a broker first needs it: the first table topic (tabletopic.manager), the first rebuild,
rollback or DLQ replay (tabletopic.ops, tabletopic.api). A broker without table topics never
loads it (tests/unit/test_lazy_imports.py)."""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys

from broker.memtrim import check_arrow_pool


async def load(module: str) -> None:
    """Import `module` in a thread, the event loop serving meanwhile; the caller then imports
    from it at no cost. Always through the thread: a module another thread is still importing
    is already in sys.modules, and importing from it on the loop would wait there.

    A first import then freezes the heap (gc.freeze), as broker.app's `settle_heap` does at
    start: every full collection would otherwise walk the ~140k objects the import made, on
    the event loop (5.5 ms each in a quiet process, against ~0 frozen; under load on shared
    cores, more). Objects frozen by the way are only ever freed by reference counting (a
    fixed amount: what existed at that moment)."""
    first = module not in sys.modules
    arrow = "pyarrow" in sys.modules
    await asyncio.to_thread(importlib.import_module, module)
    if first:
        gc.freeze()
    if not arrow and "pyarrow" in sys.modules:
        check_arrow_pool()  # jemalloc as broker/memtrim.py chose, where this pyarrow has it
