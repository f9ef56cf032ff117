"""The chunk cache's eviction order (s3stream.cache).

What must hold: the cache never holds more than its bound, nor the WAL's chunks (the tail)
more than their share of it, while chunks reads fetched may fill it; a fetched chunk a read
has served goes first; the tail's chunks keep their recency when read."""

from __future__ import annotations

from s3stream.cache import ChunkCache


def test_served_chunks_of_the_tail_keep_their_recency() -> None:
    cache = ChunkCache(300)
    cache.put((1, 0), b"w" * 100, tail=True)  # the WAL's
    cache.put((2, 0), b"f" * 100, fetched=True)  # a read's GET's
    cache.put((3, 0), b"x" * 100, tail=True)
    cache.served((2, 0))
    cache.served((1, 0))
    cache.put((4, 0), b"y" * 100)  # one must go: the fetched chunk already served
    assert [cache.contains((k, 0)) for k in (1, 2, 3, 4)] == [True, False, True, True]
    cache.put((5, 0), b"z" * 100)  # then the least recently used
    assert [cache.contains((k, 0)) for k in (1, 3, 4, 5)] == [False, True, True, True]


def test_the_tail_takes_its_share_and_reads_the_rest() -> None:
    cache = ChunkCache(1000, tail_max_bytes=400)
    for i in range(10):  # a produce load: the tail keeps its newest 400 bytes
        cache.put((i, 0), bytes(100), tail=True)
    assert cache.size == cache.tail_size == 400
    assert [i for i in range(10) if cache.contains((i, 0))] == [6, 7, 8, 9]
    for i in range(10, 16):  # a catch-up's reads fill the rest
        cache.put((i, 0), bytes(100), fetched=True)
    assert cache.size == 1000 and cache.tail_size == 400
    cache.put((16, 0), bytes(100), fetched=True)  # full: the least recently used goes (tail)
    assert not cache.contains((6, 0)) and cache.tail_size == 300 and cache.size == 1000
    cache.put((17, 0), bytes(100), tail=True)  # the least recently used goes: the tail's (7)
    assert cache.contains((17, 0)) and not cache.contains((7, 0)) and cache.tail_size == 300
    for i in range(20, 32):  # reads alone may take all of it
        cache.put((i, 0), bytes(100), fetched=True)
    assert cache.size == 1000 and cache.tail_size == 0
    cache.put((99, 0), bytes(500), tail=True)  # over the tail's share: not cached
    assert not cache.contains((99, 0))
