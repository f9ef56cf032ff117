"""Power loss: the local object store makes new directories durable, not only files.

What must survive: before a put is acknowledged, the object's file is fsynced, its directory is
fsynced after the rename, and every directory created for it (the WAL directory, a stream
object's `stream/<id>/` directories, the store root and its missing parents) is fsynced into
its parent; otherwise a power loss can drop the directory and every object in it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from s3stream import _durable
from s3stream.objectstore import LocalDirObjectStore


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths fsynced, in order: those of the file descriptors os.fsync is called with
    (the directories the store creates), and an object's write (s3stream/_durable.c, one
    call: its temporary file, then its directory after the rename, the order
    tests/unit/test_durable.py sees it make the system calls in)."""
    seen: list[Path] = []
    real: Callable[[int], None] = os.fsync
    real_put = _durable.put

    def recording(fd: int) -> None:
        seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    def put(tmp: Path, final: Path, directory: Path, parts: Any, drop: bool) -> None:
        real_put(tmp, final, directory, parts, drop)
        seen.extend([Path(tmp), Path(directory)])

    monkeypatch.setattr(os, "fsync", recording)
    monkeypatch.setattr(_durable, "put", put)
    return seen


def test_new_directories_are_fsynced_into_their_parents(
    tmp_path: Path, fsynced: list[Path]
) -> None:
    root = tmp_path / "a" / "b" / "objects"  # three directories the store creates
    store = LocalDirObjectStore(root)
    for d in (tmp_path, tmp_path / "a", tmp_path / "a" / "b"):
        assert d in fsynced, f"{d} not fsynced after a directory was created in it"
    fsynced.clear()
    store._put("stream/7/00000000000000000000-1", b"data")
    obj = root / "stream" / "7" / "00000000000000000000-1"
    assert obj.read_bytes() == b"data"
    assert root in fsynced, "the new stream/ directory was not fsynced into the root"
    assert root / "stream" in fsynced, "stream/7/ was not fsynced into stream/"
    assert fsynced[-1] == root / "stream" / "7", "the object's directory after the rename"
    assert obj.with_name(obj.name + ".tmp") in fsynced, "the object's own bytes"
    # a parent directory is fsynced before the object in it is acknowledged
    assert fsynced.index(root) < fsynced.index(root / "stream") < len(fsynced) - 1
    fsynced.clear()
    store._put("stream/7/00000000000000000100-2", b"more")
    assert root not in fsynced and root / "stream" not in fsynced  # once per directory
    store._put("wal/0000000000000003", b"wal")
    assert root in fsynced, "the new wal/ directory was not fsynced into the root"


def test_a_directory_left_by_a_crash_is_made_durable_on_first_use(
    tmp_path: Path, fsynced: list[Path]
) -> None:
    root = tmp_path / "objects"
    (root / "wal").mkdir(parents=True)  # created by a process that died before fsyncing it
    store = LocalDirObjectStore(root)
    fsynced.clear()
    store._put("wal/0000000000000001", b"x")
    assert root in fsynced
