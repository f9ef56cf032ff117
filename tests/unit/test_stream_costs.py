"""s3stream's cost attribution (s3stream.stats.StreamCosts) through the retrying object store:
a shared object's PUT split by weight, a stream object's calls by its key, the rest
unattributed; failed attempts are not costs."""

from __future__ import annotations

import asyncio

import pytest

from s3stream.objectstore import MemoryObjectStore, RetryingObjectStore
from s3stream.stats import attributed


def test_shares_keys_and_unattributed() -> None:
    async def run() -> RetryingObjectStore:
        store = RetryingObjectStore(MemoryObjectStore())
        with attributed([(1, 300), (2, 100)]):
            await store.put("wal/0000000000000001", b"x" * 1000)
        await store.put("stream/7/00000000000000000000-3", b"y" * 50)
        with attributed([(2, 1.0)]):
            await store.get_range("wal/0000000000000001", 10, 100)
        await store.get("stream/7/00000000000000000000-3")
        await store.delete("stream/7/00000000000000000000-3")
        await store.delete("wal/0000000000000001")
        await store.list("wal/")
        return store

    costs = asyncio.run(run()).stats.costs
    s = costs.streams
    assert s[1]["PUT"].bytes == pytest.approx(750) and s[1]["PUT"].requests == pytest.approx(0.75)
    assert s[2]["PUT"].bytes == pytest.approx(250) and s[2]["PUT"].requests == pytest.approx(0.25)
    assert (s[2]["GET"].requests, s[2]["GET"].bytes) == (1.0, 100)
    assert (s[7]["PUT"].bytes, s[7]["GET"].bytes, s[7]["DELETE"].requests) == (50, 50, 1)
    assert set(costs.unattributed) == {"DELETE", "LIST"}
    assert costs.totals["PUT"].requests == 2 and costs.totals["PUT"].bytes == 1050
    assert costs.totals["GET"].bytes == 150
