"""The read cache: chunk bytes by (object id, position), least recently used evicted first.

The WAL puts the bytes of every chunk it commits; reads put what they fetch (and the other
live chunks of a small object fetched whole). Chunks are immutable once committed, so an entry
is never stale; one whose chunk was compacted away is simply never asked for again.

Chunks the WAL put (the log's tail) take at most `tail_max_bytes` of the cache, the oldest put
going first beyond it: a tailing consumer or table writer reads them within moments, and a
broker under produce load then holds no more than that, while a catch-up's reads and
read-aheads may fill the whole cache.

A chunk fetched from the object store that a read has served (`served`) goes to the front of
the eviction order: a catch-up reads each chunk once, and what its read-aheads fetched for its
next read must not be evicted to keep what it already sent (benchmarks/README.md, catchup).
Chunks the WAL put keep their recency (every tailing reader reads them).
"""

from __future__ import annotations

from collections import OrderedDict


class ChunkCache:
    """LRU of chunk bytes keyed by (object id, position), bounded by total size; the chunks
    the WAL put (`put(..., tail=True)`) within `tail_max_bytes` of it (default: all)."""

    def __init__(self, max_bytes: int, tail_max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.tail_max_bytes = max_bytes if tail_max_bytes is None else tail_max_bytes
        self.size = 0
        self.tail_size = 0  # bytes of the tail's chunks
        self.hits = 0  # lookups that found the chunk (metrics)
        self.misses = 0
        self._items: OrderedDict[tuple[int, int], bytes | bytearray] = OrderedDict()
        self._tail: OrderedDict[tuple[int, int], None] = OrderedDict()  # the WAL's, put order
        self._fetched: set[tuple[int, int]] = set()  # fetched by a read, not served yet

    def get(self, key: tuple[int, int]) -> bytes | bytearray | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
        return data

    def contains(self, key: tuple[int, int]) -> bool:
        """Whether the chunk is cached (no hit or miss counted, no recency change)."""
        return key in self._items

    def put(
        self,
        key: tuple[int, int],
        data: bytes | bytearray,
        fetched: bool = False,
        tail: bool = False,
    ) -> None:
        """Cache a chunk; `fetched`: read from the object store (see `served`); `tail`: the
        WAL's (within `tail_max_bytes`)."""
        n = len(data)
        if n > (self.tail_max_bytes if tail else self.max_bytes) or key in self._items:
            return
        self._items[key] = data
        self.size += n
        if fetched:
            self._fetched.add(key)
        if tail:
            self._tail[key] = None
            self.tail_size += n
            while self.tail_size > self.tail_max_bytes:
                self._drop(next(iter(self._tail)))
        while self.size > self.max_bytes:
            self._drop(next(iter(self._items)))

    def _drop(self, key: tuple[int, int]) -> None:
        n = len(self._items.pop(key))
        self.size -= n
        self._fetched.discard(key)
        if key in self._tail:
            del self._tail[key]
            self.tail_size -= n

    def clear(self) -> None:
        self._items.clear()
        self._tail.clear()
        self._fetched.clear()
        self.size = self.tail_size = 0

    def served(self, key: tuple[int, int]) -> None:
        """A read has served this chunk: if it was fetched from the object store, it is the
        first to be evicted from now on (unless read again before that)."""
        if key in self._fetched:
            self._fetched.discard(key)
            self._items.move_to_end(key, last=False)
