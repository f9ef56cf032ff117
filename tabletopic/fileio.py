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

Every file it writes, opens for reading or deletes is counted per table (`TABLE_IO`: PUT with
the bytes written, GET with the bytes read, DELETE; LIST is counted by tabletopic.orphans),
so that a table topic's warehouse traffic can be priced. The table is the file's location up to
its `/data/` or `/metadata/` directory, named `<namespace>.<table>` after that location's last
two directories (pyiceberg's default location `<warehouse>/<namespace>[.db]/<table>`).
Process-wide: pyiceberg makes a FileIO per table it loads. (Parquet read by scans through
pyarrow's own file system is not counted; the writer reads only metadata.)

Selected with the catalog property `py-io-impl` (see tabletopic.warehouse).
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any, Self, cast

from pyiceberg.io import InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from s3stream.stats import Cost


class TableIO:
    """{table: {op: Cost}}; bumped from pyiceberg's threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, dict[str, Cost]] = {}

    def count(self, location: str, op: str, nbytes: int) -> None:
        with self._lock:
            c = self._tables.setdefault(table_of(location), {}).setdefault(op, Cost())
            c.requests += 1
            c.bytes += nbytes

    def report(self, table: str) -> dict[str, dict[str, float]]:
        """{op: {"requests", "bytes"}} of `table` (`<namespace>.<table>`)."""
        with self._lock:
            ops = dict(self._tables.get(table, {}))
        return {op: {"requests": c.requests, "bytes": c.bytes} for op, c in sorted(ops.items())}


def table_of(location: str) -> str:
    """The table a file belongs to: `ns.table` for `.../ns[.db]/table/{data,metadata}/...`
    (the last two directories of the table's location)."""
    path = location.split("://", 1)[-1]
    for marker in ("/metadata/", "/data/"):
        if marker in path:
            path = path[: path.rindex(marker)]
            break
    parent, _, name = path.rpartition("/")
    ns = parent.rpartition("/")[2]
    return f"{ns.removesuffix('.db')}.{name}" if ns and name else path


TABLE_IO = TableIO()


class _Counted:
    """A stream that counts one request of `op` with its bytes when it is first closed."""

    op = ""

    def __init__(self, inner: OutputStream | InputStream, location: str) -> None:
        self._inner = inner
        self._location = location
        self._bytes = 0
        self._closed = False

    def tell(self) -> int:
        return self._inner.tell()

    def close(self) -> None:
        self._inner.close()
        if not self._closed:
            self._closed = True
            TABLE_IO.count(self._location, self.op, self._bytes)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountingWriter(_Counted):
    """An output stream that counts one PUT of everything written when it is closed."""

    op = "PUT"

    def __init__(self, inner: OutputStream, location: str) -> None:
        super().__init__(inner, location)
        self._out = inner

    def write(self, b: bytes) -> int:
        n = self._out.write(b)
        self._bytes += len(b)
        return n


class CountingReader(_Counted):
    """An input stream that counts one GET with the bytes read when it is closed."""

    op = "GET"

    def __init__(self, inner: InputStream, location: str) -> None:
        super().__init__(inner, location)
        self._in = inner

    def read(self, size: int | None = None) -> bytes:
        # pyarrow's streams take no negative size: None (or < 0) reads to the end
        data = self._in.read() if size is None or size < 0 else self._in.read(size)
        self._bytes += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._in.seek(offset, whence)


class CountedFile(PyArrowFile):
    """A PyArrowFile whose streams are counted in TABLE_IO."""

    def create(self, overwrite: bool = False) -> OutputStream:
        return cast(OutputStream, CountingWriter(self._create(overwrite), self.location))

    def _create(self, overwrite: bool) -> OutputStream:
        return super().create(overwrite)

    def open(self, seekable: bool = True) -> InputStream:
        return cast(InputStream, CountingReader(super().open(seekable), self.location))


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


class DurableLocalFile(CountedFile):
    """A local output file whose stream is a SyncOnCloseWriter (`overwrite=False`: created
    exclusively, FileExistsError if it exists)."""

    def _create(self, overwrite: bool) -> OutputStream:
        make_dirs_durable(Path(self._path).parent)
        # an io.BufferedWriter: write, tell, close, context manager (pyiceberg's OutputStream)
        return cast(OutputStream, SyncOnCloseWriter(self._path, exclusive=not overwrite))


class DurableFileIO(PyArrowFileIO):
    """PyArrowFileIO whose local output files are fsynced (file and directory) on close."""

    def __init__(self, properties: Any = None) -> None:
        super().__init__(properties or {})

    def new_output(self, location: str) -> PyArrowFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        kind = DurableLocalFile if scheme == "file" else CountedFile
        return kind(location=location, path=path, fs=self.fs_by_scheme(scheme, netloc))

    def new_input(self, location: str) -> PyArrowFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        return CountedFile(location=location, path=path, fs=self.fs_by_scheme(scheme, netloc))

    def delete(self, location: str | InputFile | OutputFile) -> None:
        super().delete(location)
        where = location.location if isinstance(location, InputFile | OutputFile) else location
        TABLE_IO.count(where, "DELETE", 0)
