"""A fault-injecting object store wrapper: fails or stalls calls on demand."""

from __future__ import annotations

import asyncio

from s3stream.objectstore import ObjectStore, RetryableError


class PassThrough:
    """An object store that hands every call to `inner`: the base of test wrappers, which
    override the calls they observe or break."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self.inner.put(key, data)

    async def get(self, key: str) -> bytes:
        return await self.inner.get(key)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self.inner.get_range(key, start, length)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str) -> list[str]:
        return await self.inner.list(prefix)

    async def close(self) -> None:
        await self.inner.close()


class FaultyStore(PassThrough):
    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.fail_puts = 0  # fail this many PUTs
        self.fail_all_puts = False
        self.error: Exception = RetryableError("injected: 503 SlowDown")  # what a failure raises
        self.stall = asyncio.Event()
        self.stall.set()  # set = not stalled
        self.puts = 0

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self.stall.wait()
        if self.fail_all_puts or self.fail_puts > 0:
            self.fail_puts = max(0, self.fail_puts - 1)
            raise self.error
        self.puts += 1
        await self.inner.put(key, data)
