"""Types of s3stream/_durable.c (see its header comment)."""

from collections.abc import Sequence
from os import PathLike

def put(
    tmp: str | PathLike[str],
    final: str | PathLike[str],
    directory: str | PathLike[str],
    parts: Sequence[bytes | bytearray | memoryview],
    drop_cached: bool,
) -> None:
    """Write `parts` to `tmp`, fsync it (its pages then dropped from the page cache with
    `drop_cached`), rename it to `final`, fsync `directory`; without the GIL. OSError with
    the path of the step that failed."""
