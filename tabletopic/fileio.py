"""pyiceberg's PyArrowFileIO, with every local file durable when it is closed.

A table commit makes the catalog point at a metadata file, which names manifest lists, which
name manifests, which name Parquet data files. pyiceberg writes all of them before the catalog
commit, and the catalog database makes the commit itself durable; but on a local (file://)
warehouse nothing forces those files to disk, so after a power loss a committed table can name
files that are empty or missing. DurableFileIO closes every local file it writes only after
fsync of the file, and of its directory (and of each directory it had to create, in its
parent), so every file exists whole on disk before pyiceberg goes on to the catalog commit.
Files in object stores (s3:// ...) are durable once their upload returns; they go through
PyArrowFileIO unchanged.

Selected with the catalog property `py-io-impl` (see tabletopic.warehouse).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, cast

from pyiceberg.io import OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs_durable(directory: Path) -> None:
    """mkdir -p, fsyncing the parent of every directory it creates."""
    missing = []
    d = directory
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue  # made by someone else meanwhile; its creator syncs the parent
        fsync_dir(d.parent)


class SyncOnCloseWriter(io.BufferedWriter):
    """A buffered local file whose close() returns only once the data and the file's
    directory entry are on disk. Closing twice is a no-op."""

    def __init__(self, path: str, exclusive: bool) -> None:
        super().__init__(io.FileIO(path, "xb" if exclusive else "wb"), buffer_size=1 << 20)
        self._path = path

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
            os.fsync(self.fileno())
        finally:
            super().close()
        fsync_dir(os.path.dirname(self._path))


class DurableLocalFile(PyArrowFile):
    """A local output file whose stream is a SyncOnCloseWriter (`overwrite=False`: created
    exclusively, FileExistsError if it exists)."""

    def create(self, overwrite: bool = False) -> OutputStream:
        make_dirs_durable(Path(self._path).parent)
        # an io.BufferedWriter: write, tell, close, context manager (pyiceberg's OutputStream)
        return cast(OutputStream, SyncOnCloseWriter(self._path, exclusive=not overwrite))


class DurableFileIO(PyArrowFileIO):
    """PyArrowFileIO whose local output files are fsynced (file and directory) on close."""

    def __init__(self, properties: Any = None) -> None:
        super().__init__(properties or {})

    def new_output(self, location: str) -> PyArrowFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        if scheme != "file":
            return super().new_output(location)
        return DurableLocalFile(location=location, path=path, fs=self.fs_by_scheme(scheme, netloc))
