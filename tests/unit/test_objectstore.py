"""One behaviour suite, run against every object store backend (memory, file, S3 on moto's
server), then what only S3 has (prefixes, multipart, error mapping, timeouts) and the retry
layer."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from s3stream.objectstore import (
    LocalDirObjectStore,
    MemoryObjectStore,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreTimeoutError,
    RetryableError,
    RetryingObjectStore,
    RetryPolicy,
    get_parts,
    is_retriable,
    open_object_store,
    put_parts,
)
from s3stream.s3 import S3Error, S3ObjectStore, S3RetryableError, S3Settings, map_error
from tests.faults import FaultyStore
from tests.s3server import (
    TEST_AWS_ENV,
    UNSET_AWS_ENV,
    bucket_listing,
    error_endpoint,
    moto_s3,
    stalled_endpoint,
)
from tests.strace import direct_io, names, needs_strace, traced

BUCKET = "floe-unit"
MiB = 1024 * 1024
FAST = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.005, deadline=5.0)


@pytest.fixture(scope="session")
def aws_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in TEST_AWS_ENV.items():
            mp.setenv(k, v)
        for k in UNSET_AWS_ENV:
            mp.delenv(k, raising=False)
        yield


@pytest.fixture(scope="session")
def s3_endpoint(aws_env: None) -> Iterator[str]:
    """moto's S3 server, one per test session, with the bucket BUCKET."""
    with moto_s3() as endpoint:
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        c.create_bucket(Bucket=BUCKET)
        c.close()
        yield endpoint


def s3_url(endpoint: str, prefix: str | None = None, **params: object) -> str:
    """A fresh prefix per store, so tests sharing the bucket never see each other's keys."""
    query = "".join(f"&{k}={v}" for k, v in params.items())
    return f"s3://{BUCKET}/{prefix or uuid.uuid4().hex}?endpoint={endpoint}&region=us-east-1{query}"


@pytest.fixture(params=["memory", "file", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "file":
        url = (tmp_path / "objs").as_uri()
    else:
        url = s3_url(request.getfixturevalue("s3_endpoint"))
    s = open_object_store(url)
    yield s
    await s.close()


# -- every backend -------------------------------------------------------------------------
async def test_put_get_range_list_delete(store: ObjectStore) -> None:
    await store.put("wal/0001", b"0123456789")
    await store.put("wal/0002", memoryview(b"abc"))
    await store.put("other/x", b"")
    assert await store.get("wal/0001") == b"0123456789"
    assert await store.get_range("wal/0001", 3, 4) == b"3456"
    assert await store.get("other/x") == b""
    assert await store.list("wal/") == ["wal/0001", "wal/0002"]
    await store.put("wal/0001", b"new")  # overwrite is whole
    assert await store.get("wal/0001") == b"new"
    await store.delete("wal/0001")
    await store.delete("wal/0001")  # idempotent
    with pytest.raises(ObjectNotFoundError):
        await store.get("wal/0001")
    assert await store.list("wal/") == ["wal/0002"]


async def test_put_parts_writes_the_parts_one_after_the_other(store: ObjectStore) -> None:
    """put_parts (the WAL's PUT) stores exactly the joined bytes: more parts than one writev
    takes (IOV_MAX), empty parts, views (short writes: tests/unit/test_durable.py)."""
    parts: list[bytes | bytearray | memoryview] = [
        bytes([i % 251]) * (i % 7) for i in range(3000)]
    parts += [bytearray(b"tail"), memoryview(b"xyz")[1:], b""]
    await put_parts(store, "wal/parts", parts)
    assert await store.get("wal/parts") == b"".join(parts)
    await put_parts(store, "wal/none", [])
    assert await store.get("wal/none") == b""


@needs_strace
def test_file_store_keeps_wal_objects_out_of_the_page_cache(tmp_path: Path) -> None:
    """put_parts (the WAL's PUT, whose chunks the WAL caches itself, written by the event
    loop's writer thread) writes around the page cache (O_DIRECT) where the file system
    allows, else drops the object's pages after its fsync, never before; a plain put keeps
    them. Both write, fsync, rename, then fsync the directory."""
    code = f"""
        import asyncio
        from pathlib import Path
        from s3stream.objectstore import LocalDirObjectStore, put_parts

        async def main():
            store = LocalDirObjectStore(Path({str(tmp_path / "objs")!r}))
            await store.put("stream/1", b"kept")
            await put_parts(store, "wal/1", [b"dro", b"pped"])
            print(await store.get("wal/1"), await store.get("stream/1"))
            await store.close()

        asyncio.run(main())
    """
    out, calls = traced(code, tmp_path, "stream/1.tmp")
    assert out.split() == ["b'dropped'", "b'kept'"]
    called = names(calls)
    kept = called[: called.index("rename")]
    assert "fadvise64" not in kept and "fsync" in kept
    wal = next(i for i, c in enumerate(calls) if "wal/1.tmp" in c and c.startswith("openat"))
    after = names(calls[wal:])
    if direct_io(tmp_path):
        assert after[:6] == ["openat", "pwrite64", "ftruncate", "fsync", "close", "rename"], (
            calls[wal:])
        assert "O_DIRECT" in calls[wal]
    else:
        assert after[:7] == ["openat", "openat", "writev", "fsync", "fadvise64", "close",
                             "rename"], calls[wal:]
        assert "POSIX_FADV_DONTNEED" in calls[wal + 4]


async def test_wal_writes_from_another_event_loop_and_after_the_loop_closed(
    tmp_path: Path,
) -> None:
    """The writer belongs to the loop that wrote first; a put_parts from another loop (here
    a thread's) is written all the same, by a worker thread; once the writer's loop is
    closed, the next loop gets a writer of its own. Failures are the OSError of the step."""
    store = LocalDirObjectStore(tmp_path / "objs")
    await put_parts(store, "wal/1", [b"one"])

    def elsewhere() -> None:
        asyncio.run(put_parts(store, "wal/2", [b"two"]))

    await asyncio.to_thread(elsewhere)
    assert await store.get("wal/1") == b"one" and await store.get("wal/2") == b"two"
    (tmp_path / "objs" / "bad").write_bytes(b"a file where a directory should be")
    with pytest.raises(NotADirectoryError) as e:
        await put_parts(store, "bad/3", [b"x"])
    assert e.value.filename == tmp_path / "objs" / "bad" / "3.tmp"
    await put_parts(store, "wal/4", [b"four"])  # the writer goes on after a failure

    def later() -> None:  # this loop closes first; the store's writer was the test's loop's
        asyncio.run(put_parts(store, "wal/5", [b"five"]))

    await asyncio.to_thread(later)
    await store.close()
    assert await store.list("wal/") == ["wal/1", "wal/2", "wal/4", "wal/5"]
    await put_parts(store, "wal/6", [b"six"])  # after close: a new writer
    assert await store.get("wal/6") == b"six"
    await store.close()


def test_a_new_loop_gets_a_new_writer_once_the_old_one_is_closed(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path / "objs")
    for i in range(3):  # three loops, one after the other, never closing the store
        asyncio.run(put_parts(store, f"wal/{i}", [bytes([i])]))
    assert asyncio.run(store.list("wal/")) == ["wal/0", "wal/1", "wal/2"]
    asyncio.run(store.close())


async def test_a_cancelled_wal_write_still_completes_and_the_next_ones_go_on(
    tmp_path: Path,
) -> None:
    store = LocalDirObjectStore(tmp_path / "objs")
    await put_parts(store, "wal/0", [b"0"])  # wal/ made: the next write goes straight in
    task = asyncio.create_task(put_parts(store, "wal/1", [b"x" * (1 << 20)]))
    await asyncio.sleep(0)  # submitted: the task waits for its outcome
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await put_parts(store, "wal/2", [b"y"])  # written after wal/1 (one thread, in order)
    assert await store.get("wal/1") == b"x" * (1 << 20) and await store.get("wal/2") == b"y"
    await store.close()


async def test_range_reads(store: ObjectStore) -> None:
    data = bytes(range(256)) * 64
    await store.put("obj", data)
    assert await store.get_range("obj", 0, 1) == data[:1]
    assert await store.get_range("obj", 1000, 5000) == data[1000:6000]
    assert await store.get_range("obj", len(data) - 3, 3) == data[-3:]
    assert await store.get_range("obj", len(data) - 3, 100) == data[-3:]  # short at the end
    assert await store.get_range("obj", len(data), 10) == b""
    assert await store.get_range("obj", len(data) + 10, 10) == b""


async def test_range_reads_in_parts(store: ObjectStore) -> None:
    """get_parts (a range GET of several chunks, read chunk by chunk): the parts are the
    consecutive slices of the range, each its own bytes; short, then empty, past the end."""
    data = bytes(range(256)) * 64
    await store.put("obj", data)
    assert await get_parts(store, "obj", 100, [10, 0, 2000, 1]) == [
        data[100:110], b"", data[110:2110], data[2110:2111]]
    assert await get_parts(store, "obj", 0, [len(data)]) == [data]
    end = len(data) - 5
    assert await get_parts(store, "obj", end, [3, 10, 4]) == [data[end : end + 3], data[-2:], b""]
    assert await get_parts(store, "obj", len(data) + 1, [4, 4]) == [b"", b""]
    assert await get_parts(store, "obj", 7, []) == []
    for lengths in ([1, 2], [0], []):
        with pytest.raises(ObjectNotFoundError):
            await get_parts(store, "missing", 0, lengths)


async def test_missing_keys(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        await store.get("wal/missing")
    with pytest.raises(ObjectNotFoundError):
        await store.get_range("wal/missing", 0, 10)
    await store.delete("wal/missing")
    assert await store.list("wal/") == []


async def test_keys_cannot_escape_the_store(tmp_path: Path) -> None:
    s = open_object_store(str(tmp_path / "objs"))
    with pytest.raises(Exception, match="invalid object key"):
        await s.put("../escape", b"x")


# -- S3 only --------------------------------------------------------------------------------
def test_s3_url() -> None:
    s = S3Settings.from_url("s3://b/some/prefix/?endpoint=http://h:9000&region=eu-west-1")
    assert (s.bucket, s.prefix, s.endpoint, s.region) == (
        "b",
        "some/prefix/",
        "http://h:9000",
        "eu-west-1",
    )
    assert not s.path_style and s.multipart_threshold == 16 * MiB and s.part_size == 8 * MiB
    s = S3Settings.from_url("s3://b?path_style=true&part_size=5242880&timeout=2.5&workers=4")
    assert (s.prefix, s.endpoint, s.region) == ("", None, None)
    assert (s.path_style, s.part_size, s.timeout, s.workers) == (True, 5 * MiB, 2.5, 4)
    for bad in ("s3://b?colour=red", "s3://b?part_size=big", "s3:///nobucket", "s3://b?workers=0"):
        with pytest.raises(ValueError):
            S3Settings.from_url(bad)
    with pytest.raises(ValueError, match="unsupported object store URL"):
        open_object_store("gs://b/p")


async def test_s3_keys_live_under_the_prefix(s3_endpoint: str) -> None:
    a = open_object_store(s3_url(s3_endpoint, "tenant-a/data", path_style="true"))
    b = open_object_store(s3_url(s3_endpoint, "tenant-b"))
    try:
        await a.put("wal/1", b"x")
        assert "tenant-a/data/wal/1" in bucket_listing(s3_endpoint, BUCKET, "tenant-a/")
        assert await a.list("") == ["wal/1"]
        assert await b.list("") == []
        with pytest.raises(ObjectNotFoundError):
            await b.get("wal/1")
    finally:
        await a.close()
        await b.close()


def _etag(endpoint: str, key: str) -> str:
    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        return str(c.head_object(Bucket=BUCKET, Key=key)["ETag"])
    finally:
        c.close()


def _open_uploads(endpoint: str, prefix: str) -> list[Any]:
    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        return list(c.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", []))
    finally:
        c.close()


async def test_s3_multipart_upload_above_the_threshold(s3_endpoint: str) -> None:
    prefix = uuid.uuid4().hex
    url = s3_url(s3_endpoint, prefix, multipart_threshold=6 * MiB, part_size=5 * MiB)
    s = open_object_store(url)
    try:
        big = os.urandom(13 * MiB + 7)  # parts of 5, 5 and 3 MiB + 7 bytes
        await s.put("big", memoryview(big))
        await s.put("small", big[: 6 * MiB])  # at the threshold: a single PUT
        assert _etag(s3_endpoint, f"{prefix}/big").strip('"').endswith("-3")
        assert "-" not in _etag(s3_endpoint, f"{prefix}/small")
        assert await s.get("big") == big
        assert await s.get("small") == big[: 6 * MiB]
        edge = 5 * MiB
        assert await s.get_range("big", edge - 10, 20) == big[edge - 10 : edge + 10]
        assert _open_uploads(s3_endpoint, prefix) == []
    finally:
        await s.close()


async def test_s3_failed_multipart_upload_is_aborted(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = uuid.uuid4().hex
    url = s3_url(s3_endpoint, prefix, multipart_threshold=6 * MiB, part_size=5 * MiB)
    s = S3ObjectStore.from_url(url)
    real = s._client.upload_part
    parts: list[int] = []

    def upload_part(**kw: Any) -> Any:
        parts.append(kw["PartNumber"])
        if kw["PartNumber"] == 2:
            raise ClientError(
                {
                    "Error": {"Code": "InternalError", "Message": "injected"},
                    "ResponseMetadata": {"HTTPStatusCode": 500},
                },
                "UploadPart",
            )
        return real(**kw)

    monkeypatch.setattr(s._client, "upload_part", upload_part)
    try:
        with pytest.raises(S3RetryableError, match="InternalError"):
            await s.put("big", os.urandom(16 * MiB))
        assert 2 in parts
        assert _open_uploads(s3_endpoint, prefix) == []
        with pytest.raises(ObjectNotFoundError):
            await s.get("big")
    finally:
        await s.close()


@pytest.mark.parametrize(
    ("status", "code", "retriable"),
    [
        (503, "SlowDown", True),
        (500, "InternalError", True),
        (429, "TooManyRequests", True),
        (403, "AccessDenied", False),
        (404, "NoSuchBucket", False),
        (400, "InvalidArgument", False),
    ],
)
async def test_s3_errors_say_whether_they_are_retriable(
    aws_env: None, status: int, code: str, retriable: bool
) -> None:
    with error_endpoint(status, code) as (endpoint, seen):
        s = S3ObjectStore.from_url(f"s3://bkt/p?endpoint={endpoint}&region=us-east-1")
        try:
            with pytest.raises(S3Error) as info:
                await s.put("k", b"data")
        finally:
            await s.close()
        assert len(seen) == 1, "botocore must not retry on its own"
        assert (info.value.code, info.value.status) == (code, status)
        assert is_retriable(info.value) is retriable
        assert not isinstance(info.value, ObjectNotFoundError)

        seen.clear()  # the retry layer repeats only the retriable ones
        r = open_object_store(f"s3://bkt/p?endpoint={endpoint}&region=us-east-1", FAST)
        try:
            with pytest.raises(S3Error):
                await r.get("k")
        finally:
            await r.close()
        assert len(seen) == (FAST.max_attempts if retriable else 1)


async def test_s3_no_such_key_is_not_found(aws_env: None) -> None:
    with error_endpoint(404, "NoSuchKey") as (endpoint, seen):
        s = open_object_store(f"s3://bkt/p?endpoint={endpoint}&region=us-east-1", FAST)
        try:
            with pytest.raises(ObjectNotFoundError):
                await s.get("k")
        finally:
            await s.close()
        assert len(seen) == 1


def test_transport_failures_are_retriable() -> None:
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    assert isinstance(
        map_error("PUT", "k", ReadTimeoutError(endpoint_url="x")), ObjectStoreTimeoutError
    )
    assert isinstance(
        map_error("PUT", "k", ConnectTimeoutError(endpoint_url="x")), ObjectStoreTimeoutError
    )
    assert map_error("PUT", "k", EndpointConnectionError(endpoint_url="x")).retriable
    assert map_error("PUT", "k", ConnectionResetError()).retriable
    assert not map_error("PUT", "k", NoCredentialsError()).retriable


async def test_s3_unreachable_endpoint_is_retriable(aws_env: None) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    s = S3ObjectStore.from_url(f"s3://bkt/p?endpoint=http://127.0.0.1:{port}&region=us-east-1")
    try:
        with pytest.raises(RetryableError):
            await s.put("k", b"x")
    finally:
        await s.close()


async def test_s3_stalled_call_hits_the_timeout(aws_env: None) -> None:
    with stalled_endpoint() as endpoint:
        base = f"s3://bkt/p?endpoint={endpoint}&region=us-east-1&connect_timeout=1"
        # the overall per-call limit (asyncio) fires first
        s1 = S3ObjectStore.from_url(base + "&timeout=0.3&read_timeout=5")
        # botocore's read timeout fires first
        s2 = S3ObjectStore.from_url(base + "&timeout=5&read_timeout=0.3")
        # the retry layer: each attempt times out, the total time stays bounded
        policy = RetryPolicy(max_attempts=100, base_delay=0.01, max_delay=0.05, deadline=1.0)
        s3 = open_object_store(base + "&timeout=0.2&read_timeout=5", policy)
        for s, limit in ((s1, 2.0), (s2, 2.0), (s3, 3.0)):
            t0 = time.monotonic()
            with pytest.raises(ObjectStoreTimeoutError):
                await s.put("k", b"x")
            assert time.monotonic() - t0 < limit
        assert isinstance(s3, RetryingObjectStore) and s3.retries >= 2
    # the block has dropped the stalled connections, so no pool thread is still waiting
    for s in (s1, s2, s3):
        await s.close()


# -- the retry layer ------------------------------------------------------------------------
class FlakyStore(MemoryObjectStore):
    """Fails the next `failures` calls of put/get with `error`."""

    def __init__(self, failures: int, error: Exception) -> None:
        super().__init__()
        self.failures = failures
        self.error = error
        self.calls = 0

    async def put(self, key: str, data: bytes | memoryview) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        await super().put(key, data)


async def test_retry_repeats_retriable_errors(caplog: pytest.LogCaptureFixture) -> None:
    inner = FlakyStore(2, RetryableError("503 SlowDown"))
    store = RetryingObjectStore(inner, FAST)
    with caplog.at_level(logging.WARNING, logger="s3stream.objectstore"):
        await store.put("k", b"v")
    assert inner.calls == 3 and store.retries == 2
    assert await store.get("k") == b"v"
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2 and "attempt 1/4" in retries[0].getMessage()


async def test_retry_gives_up_on_non_retriable_errors() -> None:
    inner = FaultyStore(MemoryObjectStore())
    inner.error = ObjectStoreError("injected: 403 AccessDenied")  # not retriable
    inner.fail_puts = 2
    store = RetryingObjectStore(inner, FAST)
    with pytest.raises(ObjectStoreError):
        await store.put("k", b"v")
    assert inner.fail_puts == 1 and store.retries == 0  # one attempt only
    with pytest.raises(ObjectNotFoundError):  # not found is an answer, not a failure
        await store.get("nothing")
    assert store.retries == 0


async def test_retry_attempts_and_time_are_bounded() -> None:
    inner = FlakyStore(1000, ConnectionResetError("reset by peer"))
    with pytest.raises(ConnectionResetError) as info:
        await RetryingObjectStore(inner, FAST).put("k", b"v")
    assert inner.calls == FAST.max_attempts
    assert "gave up after 4 attempts" in " ".join(getattr(info.value, "__notes__", []))

    inner = FlakyStore(1000, RetryableError("503"))
    slow = RetryPolicy(max_attempts=1000, base_delay=0.02, max_delay=0.05, deadline=0.3)
    t0 = time.monotonic()
    with pytest.raises(RetryableError):
        await RetryingObjectStore(inner, slow).put("k", b"v")
    assert time.monotonic() - t0 < 0.5
    assert 3 < inner.calls < 40


def test_backoff_grows_and_is_jittered() -> None:
    p = RetryPolicy(base_delay=0.1, max_delay=1.0)
    assert [p.delay(n, 1.0) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert p.delay(3, 0.0) == 0.2  # jitter keeps at least half the delay
