"""Data files no snapshot references (written by a commit that never happened: a crash or a
lost race) are deleted once they are older than a safety age, so that files another writer
(a Spark compaction, say) is about to commit are never touched."""

from __future__ import annotations

import logging
import time
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyiceberg.table import Table

log = logging.getLogger(__name__)


def _fs_path(location: str) -> tuple[pafs.FileSystem, str]:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return pafs.LocalFileSystem(), parsed.path
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path


def remove_orphan_files(table: Table, min_age_s: float) -> list[str]:
    """Delete unreferenced files under the table's data/ directory older than min_age_s."""
    referenced = {
        urlparse(p).path or p for p in table.inspect.all_files().column("file_path").to_pylist()
    }
    fs, root = _fs_path(table.location().rstrip("/") + "/data")
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except (FileNotFoundError, OSError):
        return []
    cutoff = time.time() - min_age_s
    removed = []
    for info in infos:
        if info.type != pafs.FileType.File or info.path in referenced:
            continue
        if info.mtime is not None and info.mtime.timestamp() > cutoff:
            continue
        fs.delete_file(info.path)
        removed.append(info.path)
    if removed:
        log.info("table %s: removed %d orphan data files", table.name(), len(removed))
    return removed
