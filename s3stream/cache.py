"""The read cache: chunk bytes by (object id, position), least recently used evicted first.

The WAL puts the bytes of every chunk it commits; reads put what they fetch (and the other
live chunks of a small object fetched whole). Chunks are immutable once committed, so an entry
is never stale; one whose chunk was compacted away is simply never asked for again.
"""

from __future__ import annotations

from collections import OrderedDict


class ChunkCache:
    """LRU of chunk bytes keyed by (object id, position), bounded by total size."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0  # lookups that found the chunk (metrics)
        self.misses = 0
        self._items: OrderedDict[tuple[int, int], bytes | bytearray] = OrderedDict()

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

    def put(self, key: tuple[int, int], data: bytes | bytearray) -> None:
        if len(data) > self.max_bytes or key in self._items:
            return
        self._items[key] = data
        self.size += len(data)
        while self.size > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.size -= len(old)
