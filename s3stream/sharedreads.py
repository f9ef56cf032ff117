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
a later read with fewer records than the log then holds. A kept read is dropped as soon as a
read of the same stream starts past its offset and within what it holds, or right after it:
the consumer got it and moved on (in a catch-up every read stops at its `max_bytes`, and
keeping what was already sent held up to the whole budget for nothing). What is kept is
immutable (chunks of committed offsets); the caller checks the log start before using it
(retention).
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
    last: int  # the last offset it holds


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
        self._kept_offsets: dict[int, set[int]] = {}  # stream -> offsets of its kept reads

    async def read(
        self,
        key: Key,
        max_bytes: int,
        run: Callable[[], Awaitable[T]],
        size_of: Callable[[T], int],
        full: Callable[[T], bool],
        last_of: Callable[[T], int],
    ) -> T:
        """`run()`'s result for `key`, or that of a read of `key` under way or kept that asked
        for at least `max_bytes` (it may hold more: callers cut to what they asked for).
        `full(result)`: the read stopped at `max_bytes`, not at the log's end (then it is
        kept, `size_of(result)` bytes, holding offsets up to `last_of(result)`)."""
        self._drop_passed(key)
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
            self._keep(key, _Kept(max_bytes, value, size_of(value), last_of(value)))
        return value

    def _drop_passed(self, key: Key) -> None:
        """Drop the stream's kept reads that a read from `key`'s offset has moved past."""
        stream, offset = key
        for o in [o for o in self._kept_offsets.get(stream, ()) if o < offset]:
            if self._kept[(stream, o)].last + 1 >= offset:
                self._drop((stream, o))

    def _drop(self, key: Key) -> None:
        self.size -= self._kept.pop(key).size
        offsets = self._kept_offsets[key[0]]
        offsets.discard(key[1])
        if not offsets:
            del self._kept_offsets[key[0]]

    def _keep(self, key: Key, kept: _Kept[T]) -> None:
        if kept.size > self.max_bytes:
            return
        if key in self._kept:
            self._drop(key)
        self._kept[key] = kept
        self._kept_offsets.setdefault(key[0], set()).add(key[1])
        self.size += kept.size
        while self.size > self.max_bytes:
            self._drop(next(iter(self._kept)))
