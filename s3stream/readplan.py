"""The parts of a planned read (s3stream.reader): GETs under way that other reads wait for,
the GETs a read makes, and what it waits for."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from s3stream.index import Chunk


def span(chunks: list[Chunk], first: int, want: int) -> int:
    """The end (exclusive) of the chunks from `first` on that hold `want` bytes (at least one)."""
    end, total = first, 0
    while end < len(chunks) and (end == first or total < want):
        total += chunks[end].length
        end += 1
    return end


class InFlight(NamedTuple):
    """A range GET under way: the object's bytes from position `lo`, once it is done."""

    blob: asyncio.Future[bytes]
    lo: int


class Get(NamedTuple):
    """One range GET of a `Fetch`: the run of chunks it is for, where it ends (it starts at
    its flight's `lo`), the object's other live chunks it brings, the chunk keys it serves."""

    run: list[Chunk]
    hi: int
    others: set[tuple[int, int]]
    flight: InFlight
    mine: list[tuple[int, int]]


class Fetch(NamedTuple):
    """A planned `_fetch`: what the cache had, the GETs to make, the GETs in flight to await
    (chunk key, flight, chunk length)."""

    got: dict[tuple[int, int], bytes]
    gets: list[Get]
    waits: list[tuple[tuple[int, int], InFlight, int]]
