"""The S3 backend of the object store (AWS S3 or anything speaking its HTTP API, e.g. MinIO).

URL: `s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=REGION&path_style=true`; every key
is stored as PREFIX/KEY. MinIO and most S3-compatible servers reached by host name need
`path_style=true` (otherwise the bucket goes into the host name). Credentials come from
boto3's usual chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profiles, instance roles);
they never belong in the URL, which is logged.
More query parameters: `multipart_threshold`, `part_size` (bytes), `connect_timeout`,
`read_timeout`, `timeout` (seconds; `timeout` bounds each request as a whole) and `workers`.

boto3 is blocking, so each request runs in a thread pool owned by the store (one client, which
is thread-safe). botocore's own retries are off: `RetryingObjectStore` owns retrying (its policy:
`s3stream.objectstore.OBJECT_STORE_RETRY`, a `s3stream.retry.RetryPolicy`), and
every failure is mapped to an `ObjectStoreError` that says whether it is retriable.

Objects above `multipart_threshold` are uploaded in parts, several at a time; a failed upload
is aborted. An abort racing an in-flight part can leave that part behind, so buckets should
also carry a lifecycle rule `AbortIncompleteMultipartUpload` (S3's advice).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlparse

import boto3  # type: ignore[import-untyped]
from botocore import exceptions as boto_errors  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]

from s3stream.errors import (
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreTimeoutError,
    RetryableError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
MiB = 1024 * 1024

# error codes worth repeating the request for (besides any 5xx status)
RETRIABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "PriorRequestNotComplete",
    }
)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def _read_exactly(body: Any, n: int) -> bytes:
    """`n` bytes of a streaming body (fewer only where it ends)."""
    data = cast(bytes, body.read(n))
    if len(data) == n or not data:
        return data
    pieces, got = [data], len(data)
    while got < n:
        more = cast(bytes, body.read(n - got))
        if not more:
            break
        pieces.append(more)
        got += len(more)
    return b"".join(pieces)


class S3Error(ObjectStoreError):
    """An S3 request failed; `code` is S3's error code, `status` the HTTP status (0: none)."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class S3RetryableError(S3Error, RetryableError):
    pass


@dataclass(frozen=True)
class S3Settings:
    bucket: str
    prefix: str = ""  # "" or ending in "/"
    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False
    multipart_threshold: int = 16 * MiB
    part_size: int = 8 * MiB  # S3 wants >= 5 MiB for every part but the last
    connect_timeout: float = 5.0
    read_timeout: float = 15.0
    timeout: float = 30.0
    workers: int = 16

    @classmethod
    def from_url(cls, url: str) -> S3Settings:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"not an S3 URL: {url!r} (use s3://BUCKET/PREFIX?...)")
        prefix = parsed.path.strip("/")
        s = cls(bucket=parsed.netloc, prefix=prefix + "/" if prefix else "")
        known = {f.name: str(f.type) for f in fields(cls) if f.name not in ("bucket", "prefix")}
        changes: dict[str, Any] = {}
        for name, value in parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=False):
            kind = known.get(name)
            if kind is None:
                raise ValueError(f"unknown S3 URL parameter {name!r} in {url!r}")
            try:
                changes[name] = _parse_value(kind, value)
            except ValueError:
                raise ValueError(f"bad value {value!r} for {name!r} in {url!r}") from None
        s = replace(s, **changes)
        if s.part_size <= 0 or s.multipart_threshold <= 0 or s.workers <= 0:
            raise ValueError(f"part_size, multipart_threshold and workers must be > 0: {url!r}")
        return s


def _parse_value(kind: str, value: str) -> Any:
    if kind == "bool":
        if value.lower() in ("true", "1", "yes", ""):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise ValueError(value)
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    return value or None


def map_error(op: str, key: str, exc: BaseException) -> ObjectStoreError:
    """The ObjectStoreError for a failure of request `op` on `key`."""
    what = f"S3 {op} {key!r}"
    if isinstance(exc, ObjectStoreError):
        return exc
    if isinstance(exc, boto_errors.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = f"{what}: {code or status} {err.get('Message', '')}".rstrip()
        if code in NOT_FOUND_CODES:
            return ObjectNotFoundError(key)
        if code in RETRIABLE_CODES or status >= 500 or status in (408, 429):
            return S3RetryableError(msg, code, status)
        return S3Error(msg, code, status)
    if isinstance(
        exc, boto_errors.ConnectTimeoutError | boto_errors.ReadTimeoutError | TimeoutError
    ):
        return ObjectStoreTimeoutError(f"{what}: timed out: {exc}")
    transient = (
        boto_errors.ConnectionError,  # endpoint unreachable, SSL, proxy
        boto_errors.HTTPClientError,  # connection closed, broken response stream
        boto_errors.IncompleteReadError,
        ConnectionError,
    )
    if isinstance(exc, transient):
        return S3RetryableError(f"{what}: {type(exc).__name__}: {exc}")
    # no credentials, invalid parameters, anything unexpected: repeating will not help
    return S3Error(f"{what}: {type(exc).__name__}: {exc}")


class S3ObjectStore:
    def __init__(self, settings: S3Settings, url: str | None = None) -> None:
        self.settings = settings
        self.url = url or f"s3://{settings.bucket}/{settings.prefix}"
        config = Config(
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            retries={"total_max_attempts": 1, "mode": "standard"},  # RetryingObjectStore retries
            max_pool_connections=settings.workers,
            s3={"addressing_style": "path" if settings.path_style else "auto"},
        )
        self._client: Any = boto3.session.Session().client(
            "s3", endpoint_url=settings.endpoint, region_name=settings.region, config=config
        )
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="s3")
        self._part_slots = max(1, settings.workers // 2)  # parts of one upload in flight

    @classmethod
    def from_url(cls, url: str) -> S3ObjectStore:
        return cls(S3Settings.from_url(url), url)

    def _key(self, key: str) -> str:
        return self.settings.prefix + key

    async def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run one blocking request in the pool, bounded by the overall timeout."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._pool, fn), self.settings.timeout
            )
        except TimeoutError:
            raise ObjectStoreTimeoutError(
                f"S3 {op} {key!r}: timed out (limit {self.settings.timeout:g} s)"
            ) from None
        except Exception as e:
            raise map_error(op, key, e) from e

    # -- writes ----------------------------------------------------------------------------
    async def put(self, key: str, data: bytes | memoryview) -> None:
        body = data if isinstance(data, bytes) else bytes(data)
        if len(body) > self.settings.multipart_threshold:
            await self._put_multipart(key, body)
            return
        k = self._key(key)
        await self._call(
            "PUT",
            key,
            lambda: self._client.put_object(Bucket=self.settings.bucket, Key=k, Body=body),
        )

    async def _put_multipart(self, key: str, body: bytes) -> None:
        bucket, k, size = self.settings.bucket, self._key(key), self.settings.part_size
        created = await self._call(
            "CreateMultipartUpload",
            key,
            lambda: self._client.create_multipart_upload(Bucket=bucket, Key=k),
        )
        upload_id = str(created["UploadId"])
        view = memoryview(body)
        slots = asyncio.Semaphore(self._part_slots)

        async def part(number: int, start: int) -> dict[str, Any]:
            async with slots:
                chunk = bytes(view[start : start + size])
                resp = await self._call(
                    f"UploadPart #{number}",
                    key,
                    lambda: self._client.upload_part(
                        Bucket=bucket, Key=k, UploadId=upload_id, PartNumber=number, Body=chunk
                    ),
                )
                return {"PartNumber": number, "ETag": resp["ETag"]}

        tasks = [
            asyncio.ensure_future(part(n, start))
            for n, start in enumerate(range(0, len(body), size), start=1)
        ]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in pending:
                t.cancel()
            for t in done:
                if t.exception() is not None:
                    raise cast(BaseException, t.exception())
            parts = [t.result() for t in tasks]
            await self._call(
                "CompleteMultipartUpload",
                key,
                lambda: self._client.complete_multipart_upload(
                    Bucket=bucket, Key=k, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._abort(key, upload_id)
            raise

    async def _abort(self, key: str, upload_id: str) -> None:
        bucket, k = self.settings.bucket, self._key(key)
        try:
            await self._call(
                "AbortMultipartUpload",
                key,
                lambda: self._client.abort_multipart_upload(
                    Bucket=bucket, Key=k, UploadId=upload_id
                ),
            )
        except ObjectStoreError as e:
            log.warning("could not abort multipart upload %s of %r: %r", upload_id, k, e)

    async def delete(self, key: str) -> None:
        k = self._key(key)
        await self._call(
            "DELETE", key, lambda: self._client.delete_object(Bucket=self.settings.bucket, Key=k)
        )

    # -- reads -----------------------------------------------------------------------------
    def _body(self, key: str, byte_range: str | None) -> Any:
        """The object's (or the range's) streaming body; None when the range starts at or
        past the end (like a short read of a file). The caller reads and closes it."""
        kw: dict[str, Any] = {"Bucket": self.settings.bucket, "Key": self._key(key)}
        if byte_range is not None:
            kw["Range"] = byte_range
        try:
            return self._client.get_object(**kw)["Body"]
        except boto_errors.ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                return None
            raise

    def _read(self, key: str, byte_range: str | None) -> bytes:
        body = self._body(key, byte_range)
        if body is None:
            return b""
        try:
            return cast(bytes, body.read())
        finally:
            body.close()

    def _read_parts(self, key: str, start: int, lengths: Sequence[int]) -> list[bytes]:
        body = self._body(key, f"bytes={start}-{start + sum(lengths) - 1}")
        if body is None:
            return [b"" for _ in lengths]
        try:
            return [_read_exactly(body, n) for n in lengths]
        finally:
            body.close()

    async def get(self, key: str) -> bytes:
        return await self._call("GET", key, lambda: self._read(key, None))

    async def get_parts(self, key: str, start: int, lengths: Sequence[int]) -> list[bytes]:
        """One range GET whose body is read part by part (see objectstore.get_parts)."""
        if sum(lengths) <= 0:
            await self.get_range(key, start, 0)  # a HEAD: not found raises, as elsewhere
            return [b"" for _ in lengths]
        return await self._call("GET", key, lambda: self._read_parts(key, start, lengths))

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` (fewer at the end of the object); length < 0: to the end."""
        if length == 0:
            k = self._key(key)
            await self._call(
                "HEAD", key, lambda: self._client.head_object(Bucket=self.settings.bucket, Key=k)
            )
            return b""
        byte_range = f"bytes={start}-" if length < 0 else f"bytes={start}-{start + length - 1}"
        return await self._call("GET", key, lambda: self._read(key, byte_range))

    async def list(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        cut = len(self.settings.prefix)
        out: list[str] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.settings.bucket, "Prefix": full}
            if token:
                kw["ContinuationToken"] = token
            page = await self._call("LIST", prefix, partial(self._client.list_objects_v2, **kw))
            out.extend(str(o["Key"])[cut:] for o in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return sorted(out)
            token = page.get("NextContinuationToken")

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.shutdown, True, cancel_futures=True)
        self._client.close()
