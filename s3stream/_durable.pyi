"""Types of s3stream/_durable.c (see its header comment)."""

from collections.abc import Sequence
from os import PathLike
from typing import TypeAlias

_Path: TypeAlias = str | PathLike[str]
_Parts: TypeAlias = Sequence[bytes | bytearray | memoryview]

def put(tmp: _Path, final: _Path, directory: _Path, parts: _Parts, drop_cached: bool) -> None:
    """Write `parts` to `tmp`, fsync it (with `drop_cached`, kept out of the page cache:
    written around it where the file system allows, else its pages dropped once durable),
    rename it to `final`, fsync `directory`; without the GIL. OSError with the path of the
    step that failed."""

class Writer:
    """put's writes on a thread of its own that never takes the GIL, in the order submitted."""

    def submit(
        self, tmp: _Path, final: _Path, directory: _Path, parts: _Parts, drop_cached: bool
    ) -> int:
        """Queue a write; its id (ValueError once closed)."""

    def completed(self) -> list[tuple[int, int, _Path | None]]:
        """The writes finished since the last call: (id, errno or 0, the path of the step
        that failed or None); their buffers released."""

    def fileno(self) -> int:
        """An eventfd, readable once a write has finished."""

    def close(self) -> None:
        """Write what was submitted, then stop the thread (waits for it)."""
