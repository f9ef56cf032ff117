"""The parts of a planned read (s3stream.reader): GETs under way that other reads wait for,
the GETs a read makes, and what it waits for."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import NamedTuple

from s3stream.index import Chunk


def span(chunks: list[Chunk], first: int, want: int) -> int:
    """The end (exclusive) of the chunks from `first` on that hold `want` bytes (at least one)."""
    end, total = first, 0
    while end < len(chunks) and (end == first or total < want):
        total += chunks[end].length
        end += 1
    return end


class InFlight:
    """A range GET planned or under way: the object's chunks in [`lo`, `hi`), by position, once
    `parts` is done. Until it starts, another read that needs a chunk of the object stored
    right before or after it widens it (`joined`, see `s3stream.reader`) instead of making a
    GET of its own. `keys`: the chunk keys registered as coming with it (dropped from the
    in-flight map when it ends)."""

    __slots__ = ("hi", "joined", "keys", "lo", "parts", "started")

    def __init__(self, parts: asyncio.Future[dict[int, bytes]], lo: int, hi: int) -> None:
        self.parts = parts
        self.lo, self.hi = lo, hi
        self.started = False
        self.joined: list[tuple[int, int]] = []  # (position, length) of chunks other reads added
        self.keys: list[tuple[int, int]] = []


def pieces(lo: int, hi: int, chunks: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """[lo, hi) as consecutive (position, length) pieces: the chunks (position, length) in it,
    and what lies between them as pieces of position -1 (bytes no live chunk holds)."""
    out: list[tuple[int, int]] = []
    at = lo
    for p, n in sorted(dict(chunks).items()):
        if p < at or p + n > hi:
            continue  # outside the range (or overlapping: not a chunk of this range)
        if p > at:
            out.append((-1, p - at))
        out.append((p, n))
        at = p + n
    if at < hi:
        out.append((-1, hi - at))
    return out


class Get(NamedTuple):
    """One range GET of a `Fetch`: the run of chunks it is for, the object's other live chunks
    it brings (a whole-object GET), its flight (the range, widened by reads that join it)."""

    run: list[Chunk]
    others: set[tuple[int, int]]
    flight: InFlight


class Fetch(NamedTuple):
    """A planned fetch (s3stream.reader `_begin`): what the cache had, the GETs to make, the
    GETs in flight to await (chunk key, flight)."""

    got: dict[tuple[int, int], bytes]
    gets: list[Get]
    waits: list[tuple[tuple[int, int], InFlight]]
