"""Types of tabletopic/_batchjson.c (see its header comment)."""

from typing import Any

Column = tuple[bytes | None, int, bytes] | tuple[bytes | None, int, bytes, bytes]

def decode(
    bodies: list[tuple[Any, int, int, int, bool, int]],
    min_offset: int,
    names: tuple[bytes, ...],
    kinds: tuple[int, ...],
) -> tuple[int, bytes, bytes, bytes | None, int, bytes, bytes, list[Column]] | None: ...
