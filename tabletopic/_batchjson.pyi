"""Types of tabletopic/_batchjson.c (see its header comment)."""

from typing import Any

class Block:
    """Bytes the decoder wrote, read-only through the buffer protocol."""

    def __len__(self) -> int: ...

Column = tuple[Block | None, int, Block] | tuple[Block | None, int, Block, Block]

# (headers, each row's first header, key offsets, keys, value validity, value nulls, value
# offsets, values)
Headers = tuple[int, Block, Block, Block, Block | None, int, Block, Block]

def decode(
    bodies: list[tuple[Any, int, int, int, bool, int]],
    min_offset: int,
    names: tuple[bytes, ...],
    kinds: tuple[int, ...],
) -> tuple[int, Block, Block, Block | None, int, Block, Block, Headers | None,
           list[Column]] | None: ...
