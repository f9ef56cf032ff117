"""Stream objects are cut into chunks of about stream.chunk.max.bytes.

What must survive: after compaction, a small read inside a stream object downloads about one
chunk from the object store (bytes counted at the object store layer, on the local store and on
S3), not the whole object; the object's on-object index has one entry per chunk, and the
metadata holds one chunk row per index entry."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import boto3
import pytest

from s3stream import walformat
from s3stream.compaction import CompactionSettings, Compactor
from s3stream.log import LogStore, WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import ObjectStore, open_object_store
from tests.faults import PassThrough
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV

KiB = 1024
CHUNK = 64 * KiB
APPENDS = 256  # of 16 KiB each, one WAL object each: 4 MiB for one stream


class Counting(PassThrough):
    """Counts the bytes every GET returns (what a read downloads)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.downloaded = 0

    async def get(self, key: str) -> bytes:
        data = await self.inner.get(key)
        self.downloaded += len(data)
        return data

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        data = await self.inner.get_range(key, start, length)
        self.downloaded += len(data)
        return data


@pytest.fixture(params=["file", "s3"])
async def counting(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Counting]:
    if request.param == "file":
        url = (tmp_path / "objects").as_uri()
    else:
        for k, v in TEST_AWS_ENV.items():
            monkeypatch.setenv(k, v)
        for k in UNSET_AWS_ENV:
            monkeypatch.delenv(k, raising=False)
        endpoint = request.getfixturevalue("s3_server")
        bucket = f"chunks-{uuid.uuid4().hex[:8]}"
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        c.create_bucket(Bucket=bucket)
        c.close()
        url = f"s3://{bucket}/log?endpoint={endpoint}&region=us-east-1"
    store = Counting(open_object_store(url))
    yield store
    await store.close()


async def test_a_small_read_after_compaction_downloads_about_one_chunk(
    counting: Counting, tmp_path: Path
) -> None:
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(1)
    sid = streams[0].stream_id
    # no cache, read-ahead within one chunk: what a read downloads is what it asks for
    log = LogStore(counting, meta, WalSettings(flush_interval_ms=1, cache_max_bytes=0,
                                               readahead_bytes=CHUNK))
    await log.open(streams, [])
    try:
        for i in range(APPENDS):  # one flush, hence one WAL object, each
            _, fut = log.append(sid, 10, i, lambda base, i=i: bytes([i % 256]) * (16 * KiB))
            await asyncio.wait_for(fut, 10)
        settings = CompactionSettings(min_age_ms=0, stream_object_max_bytes=64 * 1024 * KiB,
                                      chunk_max_bytes=CHUNK, gc_delay_ms=0)
        stats = await Compactor(log, settings).run_once()
        assert stats.wal_objects == APPENDS and stats.stream_objects == 1
        counting.downloaded = 0
        (got,) = await log.read(sid, APPENDS * 10 // 2 + 3, 1)  # asks for one byte
        assert counting.downloaded <= CHUNK, \
            f"a small read downloaded {counting.downloaded} bytes (chunks are {CHUNK})"
        assert got == (APPENDS * 10 // 2, b"".join(  # the chunk of 4 WAL chunks holding it
            bytes([j % 256]) * (16 * KiB) for j in range(APPENDS // 2, APPENDS // 2 + 4)))
        (obj,) = await meta.objects("stream")
        _oid, entries = walformat.decode_index(await counting.inner.get(obj.key))
        rows = await meta.chunks_of_objects([obj.object_id])
        assert len(entries) == APPENDS * 16 * KiB // CHUNK  # 64 chunks of 64 KiB
        assert [(e.base_offset, e.last_offset, e.position, e.length) for e in entries] == [
            (r.base_offset, r.last_offset, r.position, r.length) for r in rows]
        st = log.stream(sid)
        assert [(c.base_offset, c.last_offset) for c in st.chunks] == [
            (r.base_offset, r.last_offset) for r in rows]
    finally:
        await log.close()
        await meta.close()


class PassCounting(Counting):
    """Also notes the bytes downloaded before each PUT since the previous one (what a
    compaction pass read before writing its stream objects)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.read_between_puts: list[int] = []
        self._mark = 0

    async def put(self, key: str, data: bytes | memoryview) -> None:
        if key.startswith("stream/"):
            self.read_between_puts.append(self.downloaded - self._mark)
            self._mark = self.downloaded
        await self.inner.put(key, data)


async def test_a_run_compacts_every_old_wal_object_in_passes_within_the_budget(
    counting: Counting, tmp_path: Path
) -> None:
    """What must hold: one run compacts all the WAL objects old enough (not just the first
    max_bytes_per_run of them, which made compaction fall behind a steady producer), each
    pass reading at most max_bytes_per_run before it writes, and every record survives."""
    store = PassCounting(counting.inner)
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(2)
    log = LogStore(store, meta, WalSettings(flush_interval_ms=1, cache_max_bytes=0))
    await log.open(streams, [])
    objects, size = 32, 16 * KiB
    try:
        for i in range(objects):  # one WAL object each, both streams in it
            futs = [log.append(s.stream_id, 10, i, lambda b, i=i: bytes([i]) * (size // 2))[1]
                    for s in streams]
            await asyncio.wait_for(asyncio.gather(*futs), 10)
        budget = 4 * size + 1024  # about 4 WAL objects (16 KiB of chunks + their index)
        settings = CompactionSettings(min_age_ms=0, max_bytes_per_run=budget, gc_delay_ms=0)
        stats = await Compactor(log, settings).run_once()
        assert stats.wal_objects == objects, stats
        assert await meta.objects("wal") == []
        assert len(store.read_between_puts) >= objects // 4
        assert max(store.read_between_puts) <= budget, store.read_between_puts
        for s in streams:
            got = await log.read(s.stream_id, 0, 1 << 30)
            assert b"".join(d for _b, d in got) == b"".join(
                bytes([i]) * (size // 2) for i in range(objects))
            assert got[0][0] == 0
    finally:
        await log.close()
        await meta.close()
