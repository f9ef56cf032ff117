"""Object storage behind one interface, chosen by URL scheme.

Backends: `file:///dir` (or a plain path) keeps one file per object, written to a temporary
name, fsynced and renamed so that an object is either whole or absent; `memory://` keeps
objects in a dict (tests and the null-storage benchmark only).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse


class ObjectStoreError(Exception):
    pass


class ObjectNotFoundError(ObjectStoreError):
    pass


class ObjectStore(Protocol):
    url: str

    async def put(self, key: str, data: bytes | memoryview) -> None: ...
    async def get(self, key: str) -> bytes: ...
    async def get_range(self, key: str, start: int, length: int) -> bytes: ...
    async def delete(self, key: str) -> None: ...
    async def list(self, prefix: str) -> list[str]: ...
    async def close(self) -> None: ...


class MemoryObjectStore:
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self.objects: dict[str, bytes] = {}

    async def put(self, key: str, data: bytes | memoryview) -> None:
        self.objects[key] = bytes(data)

    async def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise ObjectNotFoundError(key) from None

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return (await self.get(key))[start : start + length]

    async def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    async def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    async def close(self) -> None:
        pass


class LocalDirObjectStore:
    """One file per object under a root directory; writes are atomic and durable."""

    def __init__(self, root: Path, url: str | None = None) -> None:
        self.root = root
        self.url = url or root.as_uri()
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ObjectStoreError(f"invalid object key {key!r}")
        return self.root / key

    def _put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            raise ObjectNotFoundError(key) from None
        try:
            if length < 0:
                length = os.fstat(fd).st_size - start
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await asyncio.to_thread(self._put, key, data)

    async def get(self, key: str) -> bytes:
        return await asyncio.to_thread(self._get_range, key, 0, -1)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await asyncio.to_thread(self._get_range, key, start, length)

    async def delete(self, key: str) -> None:
        def rm() -> None:
            self._path(key).unlink(missing_ok=True)

        await asyncio.to_thread(rm)

    async def list(self, prefix: str) -> list[str]:
        def walk() -> list[str]:
            out = []
            for dirpath, _dirs, files in os.walk(self.root):
                for f in files:
                    if f.endswith(".tmp"):
                        continue
                    rel = os.path.relpath(os.path.join(dirpath, f), self.root)
                    if rel.startswith(prefix):
                        out.append(rel)
            return sorted(out)

        return await asyncio.to_thread(walk)

    async def close(self) -> None:
        pass


def open_object_store(url: str) -> ObjectStore:
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme else url)
        return LocalDirObjectStore(path.resolve(), url if parsed.scheme else None)
    if parsed.scheme == "memory":
        return MemoryObjectStore(url)
    raise ValueError(f"unsupported object store URL {url!r} (use file:///DIR or memory://)")
