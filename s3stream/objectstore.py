"""Object storage behind one interface, chosen by URL scheme.

Backends: `file:///dir` (or a plain path) keeps one file per object, written to a temporary
name, fsynced and renamed so that an object is either whole or absent, then its directory
fsynced, and every directory the store creates (or first uses) fsynced into its parent, so an
acknowledged object survives power loss; `memory://` keeps
objects in a dict (tests and the null-storage benchmark only); `s3://BUCKET/PREFIX?...` keeps
them in S3 or an S3-compatible store (see `s3stream.s3`).

`open_object_store` wraps every backend in `RetryingObjectStore`, which repeats a call that
failed with a retriable error (see `is_retriable`) under `OBJECT_STORE_RETRY` (s3stream.retry:
exponential backoff with jitter, bounded attempts and deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar, cast
from urllib.parse import urlparse

from s3stream import _durable
from s3stream.errors import ObjectNotFoundError as ObjectNotFoundError  # re-exported
from s3stream.errors import ObjectStoreError as ObjectStoreError
from s3stream.errors import ObjectStoreTimeoutError as ObjectStoreTimeoutError
from s3stream.errors import RetryableError as RetryableError
from s3stream.retry import RetryPolicy as RetryPolicy  # re-exported
from s3stream.stats import ObjectStoreStats

log = logging.getLogger(__name__)
T = TypeVar("T")
Buffer = bytes | bytearray | memoryview


def is_retriable(exc: BaseException) -> bool:
    """Whether repeating the call that raised `exc` may succeed."""
    if isinstance(exc, ObjectStoreError):
        return exc.retriable
    return isinstance(exc, TimeoutError | ConnectionError)


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


async def put_parts(store: ObjectStore, key: str, parts: Sequence[Buffer]) -> None:
    """PUT the object made of `parts` (one after the other): without joining them first where
    the store can (`put_parts`), else joined once. The WAL's PUT: the caller keeps in its own
    cache what it will read of these bytes, so a store may keep no copy in memory (the file
    store writes it around the page cache, or drops its pages once they are durable)."""
    put = getattr(store, "put_parts", None)
    if put is not None:
        await put(key, parts)
    else:
        await store.put(key, b"".join(parts))


def cut(data: bytes, lengths: Sequence[int]) -> list[bytes]:
    """`data` cut into consecutive parts of `lengths` (short or empty where it ends first)."""
    out, pos = [], 0
    for n in lengths:
        out.append(data[pos : pos + n])  # the whole of `data` itself when it is one part
        pos += n
    return out


async def get_parts(
    store: ObjectStore, key: str, start: int, lengths: Sequence[int]
) -> list[bytes]:
    """The object's bytes from `start`, one range GET, cut into consecutive parts of
    `lengths` (short or empty where the object ends first), each its own bytes object: a
    GET that brings many chunks keeps no copy of the whole range beside them (a range of a
    WAL object brings several partitions' chunks). Stores with a `get_parts` of their own (S3:
    the body read part by part; a local file: a pread per part) use it; others: `get_range`,
    cut."""
    native = getattr(store, "get_parts", None)
    if native is not None:
        return cast(list[bytes], await native(key, start, lengths))
    return cut(await store.get_range(key, start, sum(lengths)), lengths)


def _tmp(path: Path) -> Path:
    """Where an object is written before its rename to `path` (the scan skips such names)."""
    return path.with_name(path.name + ".tmp")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _LoopWriter:
    """The durable writes of one event loop on a thread that never takes the GIL
    (`s3stream._durable.Writer`, in the order submitted): the loop learns that one finished
    from the writer's eventfd, so a write costs the loop's thread no GIL hand-over, where a
    worker thread of Python's took the GIL to start and again to hand its result back, each
    time waiting for the busy loop's thread to let it go (issue 17: 2-9 ms of a WAL flush's
    p90-p99 at 2,400 Produce requests/s)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.native = _durable.Writer()
        self.waiting: dict[int, asyncio.Future[None]] = {}
        loop.add_reader(self.native.fileno(), self._completed)

    async def put(
        self, tmp: Path, final: Path, directory: Path, parts: Sequence[Buffer], drop: bool
    ) -> None:
        done: asyncio.Future[None] = self.loop.create_future()
        self.waiting[self.native.submit(tmp, final, directory, parts, drop)] = done
        await done  # cancelled: the write goes on all the same; its outcome is dropped

    def _completed(self) -> None:
        for job, err, path in self.native.completed():
            done = self.waiting.pop(job)
            if done.done():
                continue
            if err:
                done.set_exception(OSError(err, os.strerror(err), path))
            else:
                done.set_result(None)

    def close(self) -> None:
        """Finish the writes submitted (waiting for them), then stop the thread."""
        if not self.loop.is_closed():
            self.loop.remove_reader(self.native.fileno())
        self.native.close()
        if not self.loop.is_closed():
            self._completed()


class LocalDirObjectStore:
    """One file per object under a root directory; writes are atomic and durable: the file is
    written to a temporary name, fsynced, renamed, and its directory fsynced; a directory is
    fsynced into its parent (up to the root, and the root into its own parent) before the first
    object in it is acknowledged, once per directory and process (a directory left by a crash
    is made durable too)."""

    def __init__(self, root: Path, url: str | None = None) -> None:
        self.root = root
        self.url = url or root.as_uri()
        missing = [p for p in (root, *root.parents) if not p.exists()]  # deepest first
        for p in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(p)
            _fsync_dir(p.parent)
        if not missing:
            _fsync_dir(root.parent)
        self._durable_dirs = {root}
        self._dirs_lock = threading.Lock()
        self._writer: _LoopWriter | None = None  # put_parts' (the WAL's), of one event loop

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ObjectStoreError(f"invalid object key {key!r}")
        return self.root / key

    def _durable_dir(self, d: Path) -> None:
        """Make `d` (the root or below) exist with its entry, and its ancestors' entries up to
        the root, fsynced into their parents."""
        with self._dirs_lock:
            chain: list[Path] = []
            while d not in self._durable_dirs:
                chain.append(d)
                d = d.parent
            for p in reversed(chain):  # parents first
                with contextlib.suppress(FileExistsError):
                    os.mkdir(p)
                _fsync_dir(p.parent)
                self._durable_dirs.add(p)

    def _put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        self._durable_dir(path.parent)
        # write, fsync, rename, fsync the directory: one call that holds no GIL (one Python
        # call per system call waited for the busy event loop's thread after each of them)
        _durable.put(_tmp(path), path, path.parent, (data,), False)

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

    def _get_parts(self, key: str, start: int, lengths: Sequence[int]) -> list[bytes]:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            raise ObjectNotFoundError(key) from None
        try:
            out = []
            for n in lengths:
                out.append(os.pread(fd, n, start))
                start += n
            return out
        finally:
            os.close(fd)

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await asyncio.to_thread(self._put, key, data)

    async def put_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        """`put` of the joined parts kept out of the page cache: written around it (O_DIRECT,
        the parts copied into one aligned buffer) where the file system allows, else through
        it (one writev) and the object's pages dropped once durable. The WAL keeps every
        chunk it writes in its own cache, and a second copy in the page cache costs a fresh
        page of memory per byte written (in the benchmark VM that page allocation was about
        1.5 s of kernel CPU per GiB, over a third of the broker's CPU; written through the
        cache and dropped, ~0.5 s; around it, ~0.2 and a copy in the writer thread). Reads
        that miss the chunk cache, and compaction, read from disk.

        Written by the event loop's `_LoopWriter`, one after the other (the WAL's objects
        are committed in order anyway); from another loop than the writer's, by a worker
        thread as `put` does."""
        path = self._path(key)
        if path.parent not in self._durable_dirs:  # a new directory: made durable first
            await asyncio.to_thread(self._durable_dir, path.parent)
        tmp = _tmp(path)
        writer = self._loop_writer()
        if writer is None:
            await asyncio.to_thread(_durable.put, tmp, path, path.parent, parts, True)
        else:
            await writer.put(tmp, path, path.parent, parts, True)

    def _loop_writer(self) -> _LoopWriter | None:
        """The writer of the running loop (made on first use, and again once its loop is
        closed); None from another loop while the writer's is open."""
        loop = asyncio.get_running_loop()
        if self._writer is not None and self._writer.loop.is_closed():
            self._writer.close()
            self._writer = None
        if self._writer is None:
            self._writer = _LoopWriter(loop)
        return self._writer if self._writer.loop is loop else None

    async def get(self, key: str) -> bytes:
        return await asyncio.to_thread(self._get_range, key, 0, -1)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await asyncio.to_thread(self._get_range, key, start, length)

    async def get_parts(self, key: str, start: int, lengths: Sequence[int]) -> list[bytes]:
        return await asyncio.to_thread(self._get_parts, key, start, lengths)

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
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# Object store calls: a few quick retries, and a call gives up within `deadline` + one attempt
# (bounded by the backend's own per-request timeout). Only errors `is_retriable` accepts are
# repeated, whatever the policy's own predicate.
OBJECT_STORE_RETRY = RetryPolicy(
    max_attempts=6, base_delay=0.05, max_delay=2.0, deadline=30.0, jitter=0.5,
    retriable=is_retriable,
)


class RetryingObjectStore:
    """Repeats calls of `inner` that fail with a retriable error (`is_retriable`) under the
    retry policy (s3stream.retry); any other error, and the last error once the attempts or the
    deadline are spent, propagate as raised. Every call of the ObjectStore interface is
    idempotent, so repeating is safe."""

    def __init__(
        self,
        inner: ObjectStore,
        policy: RetryPolicy | None = None,
        *,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        p = policy or OBJECT_STORE_RETRY
        if p.retriable is not is_retriable:
            narrower = p.retriable
            p = replace(p, retriable=lambda e: is_retriable(e) and narrower(e))
        self.policy = p
        self._rand = rand
        self.retries = 0  # total retries made (for tests and metrics)
        self.stats = ObjectStoreStats()  # per attempt: requests, errors, latency (metrics)

    def _retried(self, exc: BaseException) -> None:
        self.retries += 1
        self.stats.retries += 1

    async def _run(
        self, op: str, key: str, call: Callable[[], Awaitable[T]], put_bytes: int = 0
    ) -> T:
        """The call under the retry policy; every attempt counted in `stats`, and the call,
        once it succeeded, in `stats.costs` (with its bytes: written by a PUT, read by a GET)."""

        async def attempt() -> T:
            began = time.monotonic()
            try:
                result = await call()
            except Exception as e:
                fault = None if isinstance(e, ObjectNotFoundError) else e  # a 404 is an answer
                self.stats.record(op, time.monotonic() - began, fault)
                raise
            self.stats.record(op, time.monotonic() - began, None)
            return result

        result = await self.policy.run_async(
            attempt, f"object store {op} {key!r}", rand=self._rand, on_retry=self._retried,
            logger=log,
        )
        if isinstance(result, bytes | bytearray | memoryview):
            got = len(result)
        elif isinstance(result, list):  # get_parts
            got = sum(len(part) for part in result)
        else:
            got = 0
        self.stats.costs.record(op, key, put_bytes + got)
        return result

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self._run("PUT", key, lambda: self.inner.put(key, data), memoryview(data).nbytes)

    async def put_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        """PUT the object made of `parts`, joined only if the store below needs it whole."""
        size = sum(memoryview(p).nbytes for p in parts)
        await self._run("PUT", key, lambda: put_parts(self.inner, key, parts), size)

    async def get(self, key: str) -> bytes:
        return await self._run("GET", key, lambda: self.inner.get(key))

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self._run("GET", key, lambda: self.inner.get_range(key, start, length))

    async def get_parts(self, key: str, start: int, lengths: Sequence[int]) -> list[bytes]:
        return await self._run("GET", key, lambda: get_parts(self.inner, key, start, lengths))

    async def delete(self, key: str) -> None:
        await self._run("DELETE", key, lambda: self.inner.delete(key))

    async def list(self, prefix: str) -> list[str]:
        return await self._run("LIST", prefix, lambda: self.inner.list(prefix))

    async def close(self) -> None:
        await self.inner.close()


def is_local_dir(url: str) -> bool:
    """Whether `url` names a local directory store (a path or file:// URL)."""
    return urlparse(url).scheme in ("", "file")


def open_backend(url: str) -> ObjectStore:
    """The backend for `url`, without the retry layer."""
    parsed = urlparse(url)
    if is_local_dir(url):
        path = Path(parsed.path if parsed.scheme else url)
        return LocalDirObjectStore(path.resolve(), url if parsed.scheme else None)
    if parsed.scheme == "memory":
        return MemoryObjectStore(url)
    if parsed.scheme == "s3":
        from s3stream.s3 import S3ObjectStore  # boto3 is imported only when S3 is used

        return S3ObjectStore.from_url(url)
    raise ValueError(
        f"unsupported object store URL {url!r} (use file:///DIR, memory:// or s3://BUCKET/PREFIX)"
    )


def open_object_store(url: str, retry: RetryPolicy | None = None) -> ObjectStore:
    """The backend for `url` behind the retry layer."""
    return RetryingObjectStore(open_backend(url), retry)
