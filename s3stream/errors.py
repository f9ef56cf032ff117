"""Object store errors, shared by every backend (`s3stream.objectstore`, `s3stream.s3`)."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ObjectNotFoundError", "ObjectStoreError", "ObjectStoreTimeoutError", "RetryableError"]


class ObjectStoreError(Exception):
    """A failed object store call. `retriable`: the same call may succeed if repeated."""

    retriable: ClassVar[bool] = False


class RetryableError(ObjectStoreError):
    """A transient failure: throttling, 5xx, a timeout, a dropped connection."""

    retriable: ClassVar[bool] = True


class ObjectStoreTimeoutError(RetryableError):
    pass


class ObjectNotFoundError(ObjectStoreError):
    pass
