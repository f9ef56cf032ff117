"""Deleting a table's orphan files: files under the table's `data/` directory that no snapshot
references (written for a commit that never happened: a crash, a lost race).

What it deletes, and why that is safe:
  - Only files under the table's data directory (`<table location>/data/`, or the table
    property `write.data.path`); the `metadata/` directory (metadata, manifest lists,
    manifests, statistics) is never touched.
  - A file is referenced if any snapshot of the table (every branch and tag, expired ones
    excepted) names it: data and delete files of every manifest entry (deleted entries
    included), manifests, manifest lists, statistics files.
  - The listing is taken first and the references are read afterwards from a freshly loaded
    table, so a file committed while the sweep runs is referenced. Files not committed yet
    (a worker's or a Spark rewrite's files before their commit) are protected by the age: a
    file younger than `min_age_s` (by its modification time; unknown time: kept) is never
    deleted; the files of the workers' file sets waiting in the metadata database are kept
    too, whatever their age (and a file set older than half the age is never committed). The
    default age (`table.orphan.min.age.ms`) is Iceberg's 3 days.
  - Listing and references are compared as full URIs, both through the table's own FileIO
    (PyArrowFileIO: the same filesystem, endpoint and credentials), normalised to
    (scheme family, bucket/path). A file is deleted only if that identity is not referenced.
  - A mismatch between the two is taken for a bug, not for orphans, and nothing is deleted
    (logged as an error): when the table references files and none of them is in the listing
    while the listing holds files, or when a referenced file is in the listing under another
    spelling (s3a:// for s3://, say).
"""

from __future__ import annotations

import logging
import posixpath
import time
from dataclasses import dataclass

import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from tabletopic.fileio import TABLE_IO

log = logging.getLogger(__name__)

WRITE_DATA_PATH = "write.data.path"  # Iceberg's table property for where data files go
SCHEME_FAMILY = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "": "file"}


@dataclass(frozen=True)
class FileRef:
    """A file's identity (scheme family + bucket/path) and its scheme as spelled."""

    scheme: str
    path: str

    @property
    def family(self) -> str:
        return SCHEME_FAMILY.get(self.scheme, self.scheme)

    @property
    def identity(self) -> tuple[str, str]:
        return (self.family, self.path)

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.path}"


def file_ref(location: str) -> FileRef:
    """Parse a location the way PyArrowFileIO does: (scheme, bucket/key or absolute path)."""
    scheme, _netloc, path = PyArrowFileIO.parse_location(location)
    return FileRef(scheme.lower(), posixpath.normpath(path) if path else path)


def referenced_files(table: Table) -> tuple[set[str], set[str]]:
    """The locations any snapshot of `table` references (see the module docstring): (data and
    delete files, every other file: manifests, manifest lists, statistics)."""
    io = table.io
    content: set[str] = set()
    other: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        other.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            other.add(manifest.manifest_path)
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                content.add(entry.data_file.file_path)
    for stats in [*table.metadata.statistics, *table.metadata.partition_statistics]:
        other.add(stats.statistics_path)
    return content, other


def _filesystem(table: Table, location: str) -> tuple[pafs.FileSystem, FileRef]:
    io = table.io
    if not isinstance(io, PyArrowFileIO):  # e.g. FsspecFileIO: list with pyarrow, same props
        io = PyArrowFileIO(io.properties)
    scheme, netloc, _path = PyArrowFileIO.parse_location(location)
    return io.fs_by_scheme(scheme, netloc), file_ref(location)


def remove_orphan_files(
    table: Table, min_age_s: float, keep: frozenset[str] = frozenset()
) -> list[str]:
    """Delete the files under the table's data/ directory that no snapshot references and that
    are older than `min_age_s` seconds; returns their URIs. `keep`: URIs of files waiting for
    a commit (the workers' file sets, tabletopic.coordinator), never deleted whatever their
    age. Deletes nothing, and logs an error, when the listing and the references do not fit
    together (see the module docstring)."""
    data_dir = table.properties.get(WRITE_DATA_PATH) or table.location().rstrip("/") + "/data"
    fs, root = _filesystem(table, data_dir.rstrip("/"))
    try:
        infos = fs.get_file_info(pafs.FileSelector(root.path, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    finally:
        TABLE_IO.count(data_dir.rstrip("/") + "/", "LIST", 0)  # costs (tabletopic/fileio.py)
    listed = {
        FileRef(root.scheme, posixpath.normpath(i.path)).identity: i
        for i in infos
        if i.type == pafs.FileType.File
    }
    if not listed:
        return []
    table = table.refresh()  # references read after the listing: a file committed meanwhile
    content, other = referenced_files(table)  # is both listed and referenced
    content_refs = [file_ref(p) for p in content]
    referenced = {r.identity for r in content_refs} | {file_ref(p).identity for p in other}
    referenced |= {file_ref(p).identity for p in keep}
    found = [r for r in content_refs if r.identity in listed]
    name = ".".join(table.name())
    if content_refs and not found:
        log.error(
            "table %s: none of its %d data/delete files (e.g. %s) shows up in the listing of "
            "%s (%d files): references and listing disagree; not deleting anything",
            name,
            len(content_refs),
            content_refs[0].uri,
            root.uri,
            len(listed),
        )
        return []
    misspelled = [r for r in found if r.scheme != root.scheme]
    if misspelled:
        log.error(
            "table %s: %d of its files are listed under %s:// but referenced as %s (e.g. %s);"
            " not deleting anything",
            name,
            len(misspelled),
            root.scheme,
            misspelled[0].scheme,
            misspelled[0].uri,
        )
        return []
    cutoff = time.time() - min_age_s
    removed: list[str] = []
    for identity, info in sorted(listed.items()):
        if identity in referenced:
            continue
        if info.mtime is None or info.mtime.timestamp() > cutoff:
            continue
        try:
            fs.delete_file(info.path)
        except FileNotFoundError:
            continue  # gone meanwhile (an expiry deletes the files it unreferences)
        removed.append(FileRef(root.scheme, identity[1]).uri)
        TABLE_IO.count(removed[-1], "DELETE", 0)
    if removed:
        log.info("table %s: removed %d orphan data files", name, len(removed))
    return removed
