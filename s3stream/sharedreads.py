"""Reads of the same (stream, offset) made once, and full reads kept until asked for again.

Why: a Fetch of many partitions answers with the reads that finished in time and leaves the
others running (broker.handlers.fetch.SERVE_WITHIN_S); the consumer then asks again for the
partitions it did not get, at the same offsets. Before, each such fetch started a new read of
the same bytes, and the chunk cache, churned by the other partitions' reads in between, had
usually dropped what the previous one fetched: in a catch-up of 100 partitions each partition
was read up to 37 times at the same offset (8-9 MiB each time) before one read finished in a
fetch's window, 14x the bytes served read from the store. Now a read under way is joined,
and a read that filled its `max_bytes` is kept (within a byte budget, least recently used
dropped first) for the fetch that comes back for it.

Only reads that stopped at `max_bytes` are kept: one that stopped at the log's end would answer
a later read with fewer records than the log then holds. What is kept is immutable (chunks of
committed offsets); the caller checks the log start before using it (retention).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")
Key = tuple[int, int]  # (stream id, offset)


class _Kept(NamedTuple, Generic[T]):
    max_bytes: int
    value: T
    size: int


class ReadStopped(Exception):
    """The read another caller joined was cancelled before it finished (retriable)."""


class SharedReads(Generic[T]):
    """One read per (stream, offset) at a time, and full reads kept within `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0  # bytes of the kept reads
        self.joined = 0  # reads answered by a read under way or kept (metrics, tests)
        self._running: dict[Key, tuple[int, asyncio.Future[T]]] = {}
        self._kept: OrderedDict[Key, _Kept[T]] = OrderedDict()

    async def read(
        self,
        key: Key,
        max_bytes: int,
        run: Callable[[], Awaitable[T]],
        size_of: Callable[[T], int],
        full: Callable[[T], bool],
    ) -> T:
        """`run()`'s result for `key`, or that of a read of `key` under way or kept that asked
        for at least `max_bytes` (it may hold more: callers cut to what they asked for).
        `full(result)`: the read stopped at `max_bytes`, not at the log's end (then it is
        kept, `size_of(result)` bytes)."""
        kept = self._kept.get(key)
        if kept is not None and kept.max_bytes >= max_bytes:
            self._kept.move_to_end(key)
            self.joined += 1
            return kept.value
        running = self._running.get(key)
        if running is not None and running[0] >= max_bytes:
            try:
                value = await asyncio.shield(running[1])  # a joiner's cancel is not the read's
            except ReadStopped:
                pass  # that read was cancelled: make one
            else:
                self.joined += 1
                return value
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        entry = (max_bytes, future)
        self._running[key] = entry
        try:
            value = await run()
        except BaseException as e:
            future.set_exception(e if isinstance(e, Exception) else ReadStopped(repr(e)))
            future.exception()  # retrieved: nobody may have joined
            raise
        finally:
            if self._running.get(key) is entry:
                del self._running[key]
        future.set_result(value)
        if full(value):
            self._keep(key, _Kept(max_bytes, value, size_of(value)))
        return value

    def _keep(self, key: Key, kept: _Kept[T]) -> None:
        if kept.size > self.max_bytes:
            return
        old = self._kept.pop(key, None)
        if old is not None:
            self.size -= old.size
        self._kept[key] = kept
        self.size += kept.size
        while self.size > self.max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self.size -= dropped.size
