"""Log compaction (broker/logcleaner.py) on a real Storage: s3stream on a local object store
and SQLite metadata, batches appended through the produce path, compacted into stream objects
by s3stream's compactor, then cleaned; everything read back through Storage.read."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.errors import KafkaError
from broker.logcleaner import CleanerSettings, LogCleaner
from broker.protocol import records
from broker.protocol.recordcodec import (
    RawRecord,
    Record,
    decode_records,
    encode_batch,
    encode_records,
)
from broker.storage import Storage
from s3stream.compaction import CompactionSettings, Compactor
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore, open_metadata_store
from s3stream.objectstore import open_object_store
from tests.faults import FaultyStore

RETENTION_MS = 60_000
COMPACT = {"cleanup.policy": "compact", "delete.retention.ms": str(RETENTION_MS)}
NOW = 1_700_000_000_000 + 3_600_000  # well after every record's timestamp (encode_batch ts)


async def open_storage(
    root: Path, faulty: bool = False, meta_url: str | None = None, objects_url: str | None = None
) -> Storage:
    objects = open_object_store(objects_url or (root / "objects").as_uri())
    store = FaultyStore(objects) if faulty else objects
    meta = SqliteMetadataStore(root / "meta.db") if meta_url is None else open_metadata_store(
        meta_url
    )
    storage = Storage(store, meta, WalSettings(flush_interval_ms=1))
    await storage.open()
    return storage


@pytest.fixture(params=["sqlite", "postgresql"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    """A Storage with one compacted topic "t", metadata in SQLite and in PostgreSQL."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    s = await open_storage(tmp_path, meta_url=url)
    await s.create_topic("t", 1, {**COMPACT})
    yield s
    await s.close()


Rec = tuple[bytes | None, bytes | None]


async def produce(
    storage: Storage, batch: list[Rec], topic: str = "t", ts: int = 1_700_000_000_000
) -> int:
    data = encode_batch([(k, v, []) for k, v in batch], timestamp_ms=ts)
    return (await storage.append(topic, 0, data)).base_offset


async def settle(storage: Storage) -> None:
    """Move every WAL chunk into stream objects (what the cleaner works on)."""
    settings = CompactionSettings(min_age_ms=0, gc_delay_ms=0, chunk_max_bytes=256)
    await Compactor(storage.log, settings).run_once()


async def read_all(storage: Storage, start: int = 0, topic: str = "t") -> list[Record]:
    out: list[Record] = []
    offset = start
    _, end = storage.offsets(topic, 0)
    while offset < end:
        data = await storage.read(topic, 0, offset, 1 << 20, True)
        headers = records.iter_headers(data)
        assert headers, f"no batch at offset {offset} < high watermark {end}"
        for h in headers:
            out += [r for r in decode_records(data, h) if r.offset >= offset]
            offset = max(offset, h.next_offset)
    return out


def chunk_ranges(storage: Storage, topic: str = "t") -> list[tuple[int, int]]:
    st = storage.log.stream(storage.stream_id(topic, 0))
    return [(c.base_offset, c.last_offset) for c in st.chunks]


def assert_contiguous(storage: Storage) -> None:
    st = storage.log.stream(storage.stream_id("t", 0))
    ranges = chunk_ranges(storage)
    assert ranges[0][0] <= st.start_offset
    for (_, last), (base, _) in itertools.pairwise(ranges):
        assert base == last + 1, ranges
    assert ranges[-1][1] == st.end_offset - 1


Latest = dict[bytes, tuple[int, bytes | None]]


async def write_updates(storage: Storage, keys: int, rounds: int) -> Latest:
    """`rounds` updates of every key in batches of 5 records, every 7th key deleted in the
    last round; returns key -> (offset, value) of the latest record."""
    latest: Latest = {}
    pending: list[Rec] = []
    for r in range(rounds):
        for k in range(keys):
            key = b"k%03d" % k
            value = None if r == rounds - 1 and k % 7 == 0 else b"v%d-%d" % (k, r)
            pending.append((key, value))
            if len(pending) == 5:
                base = await produce(storage, pending)
                for i, (kk, vv) in enumerate(pending):
                    assert kk is not None
                    latest[kk] = (base + i, vv)
                pending = []
    assert not pending
    return latest


async def test_cleaning_keeps_the_latest_record_per_key_at_its_offset(storage: Storage) -> None:
    """Must survive: after cleaning, a reader from offset 0 sees exactly the latest record of
    every key (tombstones too, until delete.retention.ms), each at the offset it was written,
    offsets strictly increasing; chunk ranges still tile the log; fewer bytes stored; a read
    at a cleaned-away offset returns the next surviving record. After the delete horizon the
    tombstones are gone too."""
    latest = await write_updates(storage, keys=40, rounds=6)
    await settle(storage)
    before = sum(c.length for c in storage.log.stream(storage.stream_id("t", 0)).chunks)
    cleaner = LogCleaner(storage, CleanerSettings())
    stats = await cleaner.run_once(NOW)
    assert stats.streams_cleaned == 1 and stats.records_removed == 40 * 5
    got = await read_all(storage)
    assert [r.offset for r in got] == sorted(off for off, _ in latest.values())
    assert {r.key: (r.offset, r.value) for r in got} == latest
    assert_contiguous(storage)
    after = sum(c.length for c in storage.log.stream(storage.stream_id("t", 0)).chunks)
    assert after < before / 3
    # a fetch at a removed offset answers with the next surviving record
    removed = 3
    assert removed not in {r.offset for r in got}
    first = (await read_all(storage, start=removed))[0]
    assert first.offset == min(r.offset for r in got if r.offset > removed)
    # nothing new, before the horizon: a pass is a no-op; after it, tombstones are removed
    assert (await cleaner.run_once(NOW + 1000)).streams_cleaned == 0
    stats = await cleaner.run_once(NOW + RETENTION_MS + 1)
    assert stats.streams_cleaned == 1 and stats.records_removed == 6
    got = await read_all(storage)
    assert {r.key: (r.offset, r.value) for r in got} == {
        k: v for k, v in latest.items() if v[1] is not None
    }
    assert_contiguous(storage)


async def test_tombstone_horizon_starts_at_the_cleaning_that_keeps_it(storage: Storage) -> None:
    """Must survive: a tombstone stays readable for delete.retention.ms after the first
    cleaning that keeps it, and an empty tail left by removed records is still covered, so
    a reader from offset 0 reaches the high watermark."""
    await produce(storage, [(b"a", b"1"), (b"b", b"2")])
    await produce(storage, [(b"a", None), (b"b", None)])
    await settle(storage)
    cleaner = LogCleaner(storage, CleanerSettings())
    await cleaner.run_once(NOW)
    assert [(r.key, r.value) for r in await read_all(storage)] == [(b"a", None), (b"b", None)]
    await cleaner.run_once(NOW + RETENTION_MS - 1)
    assert len(await read_all(storage)) == 2, "tombstones removed before their horizon"
    await cleaner.run_once(NOW + RETENTION_MS)
    assert await read_all(storage) == []
    assert_contiguous(storage)
    data = await storage.read("t", 0, 0, 1 << 20, True)
    (h,) = records.iter_headers(data)  # one empty batch covering the whole cleaned range
    assert (h.base_offset, h.last_offset, h.record_count) == (0, 3, 0)
    # a chunk holding no record has no timestamp: time lookups find nothing there
    assert [c.max_timestamp for c in storage.log.stream(storage.stream_id("t", 0)).chunks] == [-1]
    assert await storage.offset_for_time("t", 0, -3) is None
    assert await storage.offset_for_time("t", 0, 0) is None


async def test_cleaned_batches_and_chunks_carry_the_max_timestamp_of_what_they_keep(
    storage: Storage,
) -> None:
    """Must survive: when the newest record of a batch is cleaned away, the batch's and the
    chunk's max timestamp become those of the records kept, so time retention and ListOffsets
    by time and max timestamp go by records that exist."""
    t0 = 1_700_000_000_000
    two = records.read_header(encode_batch([(b"a", b"1", []), (b"b", b"2", [])]))
    batch = encode_records(
        two, [RawRecord(0, t0, b"a", b"1", b"\x00"), RawRecord(1, t0 + 5000, b"b", b"2", b"\x00")],
        0, base_timestamp=t0, max_timestamp=t0 + 5000,
    )
    await storage.append("t", 0, batch)
    await produce(storage, [(b"b", b"3")], ts=t0 + 1000)  # supersedes the newest record
    await settle(storage)
    await LogCleaner(storage, CleanerSettings()).run_once(NOW)
    got = await read_all(storage)
    assert [(r.offset, r.key, r.timestamp) for r in got] == [(0, b"a", t0), (2, b"b", t0 + 1000)]
    data = await storage.read("t", 0, 0, 1 << 20, True)
    assert [h.max_timestamp for h in records.iter_headers(data)] == [t0, t0 + 1000]
    chunks = storage.log.stream(storage.stream_id("t", 0)).chunks
    assert max(c.max_timestamp for c in chunks) == t0 + 1000
    assert await storage.offset_for_time("t", 0, -3) == (2, t0 + 1000)


async def test_bounded_key_map_cleans_in_several_passes(storage: Storage) -> None:
    """Must survive: with a key map far smaller than the number of keys, each pass cleans the
    part its map covered; repeated passes reach the same result as one big pass (with
    min.cleanable.dirty.ratio low enough that every dirty remainder is due)."""
    await storage.set_topic_configs("t", {**COMPACT, "min.cleanable.dirty.ratio": "0.01"}, False)
    latest = await write_updates(storage, keys=30, rounds=4)
    await settle(storage)
    cleaner = LogCleaner(storage, CleanerSettings(max_keys=8, chunk_max_bytes=300))
    for _ in range(40):
        await cleaner.run_once(NOW)
    got = await read_all(storage)
    assert {r.key: (r.offset, r.value) for r in got} == latest
    assert len(got) == len(latest)
    assert_contiguous(storage)


async def test_a_pass_whose_chunks_changed_meanwhile_is_abandoned(tmp_path: Path) -> None:
    """Must survive: when the chunks a pass read are changed before it commits (here retention
    drops the first one while the pass is writing), the pass commits nothing, deletes its own
    never-referenced objects, and the log is exactly what retention left; the next pass
    cleans."""
    storage = await open_storage(tmp_path, faulty=True)
    try:
        await storage.create_topic("t", 1, {**COMPACT})
        for _ in range(3):  # three stream objects
            await write_updates(storage, keys=10, rounds=1)
            await settle(storage)
        everything = await read_all(storage)
        store = storage.objects
        assert isinstance(store, FaultyStore)
        sid = storage.stream_id("t", 0)
        assert len(storage.log.stream(sid).chunks) > 2
        cut = storage.log.stream(sid).chunks[0].last_offset + 1
        cleaner = LogCleaner(storage, CleanerSettings(chunk_max_bytes=200, object_max_bytes=1))
        store.stall.clear()
        task = asyncio.create_task(cleaner.run_once(NOW))
        await asyncio.sleep(0.3)  # the pass is now waiting to write its first object
        assert not task.done()
        await storage.log.truncate(sid, cut)  # retention, concurrently
        store.stall.set()
        stats = await asyncio.wait_for(task, 10)
        assert stats.abandoned == 1 and stats.streams_cleaned == 0
        assert await read_all(storage, start=cut) == [r for r in everything if r.offset >= cut]
        stored = set(await store.list("stream/"))
        assert stored == {o.key for o in await storage.meta.objects("stream")}, "leaked objects"
        stats = await cleaner.run_once(NOW)
        assert stats.streams_cleaned == 1
        expected: dict[bytes | None, tuple[int, bytes | None]] = {}
        for r in everything:
            if r.offset >= cut:
                expected[r.key] = (r.offset, r.value)
        got = await read_all(storage, start=cut)
        assert {r.key: (r.offset, r.value) for r in got} == expected
        assert len(got) == len(expected)
    finally:
        await storage.close()


async def test_cleaning_races_with_compaction_and_appends(storage: Storage) -> None:
    """Must survive: cleaner passes running concurrently with s3stream compaction and new
    appends lose nothing: in the end every key's latest record is there at its offset, and
    only those."""
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    compactor = Compactor(storage.log, CompactionSettings(min_age_ms=0, gc_delay_ms=0))
    cleaner = LogCleaner(storage, CleanerSettings(chunk_max_bytes=400))

    async def writer(round_: int) -> None:
        for i in range(10):
            batch: list[Rec] = [(b"k%d" % ((round_ * 7 + i * 3 + j) % 25), b"r%d-%d" % (round_, i))
                                for j in range(3)]
            base = await produce(storage, batch)
            for j, (k, v) in enumerate(batch):
                assert k is not None
                latest[k] = (base + j, v)

    for round_ in range(12):
        await asyncio.gather(writer(round_), compactor.run_once(), cleaner.run_once(NOW),
                             cleaner.run_once(NOW))
        assert_contiguous(storage)
    await settle(storage)
    await cleaner.run_once(NOW)
    got = await read_all(storage)
    assert {r.key: (r.offset, r.value) for r in got} == latest
    assert len(got) == len(latest)


async def test_keyless_record_to_compacted_topic_is_rejected(storage: Storage) -> None:
    """Must survive: a batch with a keyless record is refused with INVALID_RECORD and nothing
    of it is appended; keyed records still go through."""
    with pytest.raises(KafkaError) as e:
        await produce(storage, [(b"a", b"1"), (None, b"2")])
    assert e.value.code == 87
    assert storage.offsets("t", 0) == (0, 0)
    assert await produce(storage, [(b"a", b"1")]) == 0


async def test_lag_and_dirty_ratio_decide_when_a_partition_is_cleaned(storage: Storage) -> None:
    """Must survive: records younger than min.compaction.lag.ms are never cleaned; a dirty
    part below min.cleanable.dirty.ratio waits, unless it is older than max.compaction.lag.ms;
    a dirty part above the ratio is cleaned."""
    base_ts = 1_700_000_000_000
    await storage.set_topic_configs("t", {**COMPACT, "min.compaction.lag.ms": "600000",
                                          "max.compaction.lag.ms": "7200000",
                                          "delete.retention.ms": "86400000"}, False)
    latest = await write_updates(storage, keys=20, rounds=5)
    await settle(storage)
    cleaner = LogCleaner(storage, CleanerSettings())
    young = base_ts + 599_999  # every record is 599,999 ms old
    assert (await cleaner.run_once(young)).streams_cleaned == 0
    assert len(await read_all(storage)) == 100
    assert (await cleaner.run_once(base_ts + 600_000)).streams_cleaned == 1
    assert len(await read_all(storage)) == len(latest)
    # a small dirty part (2 of 22 records' bytes) is below the 0.5 ratio: it waits
    await produce(storage, [(b"k000", b"again"), (b"k001", b"again")])
    await settle(storage)
    late = base_ts + 3_600_000
    assert (await cleaner.run_once(late)).streams_cleaned == 0
    assert len(await read_all(storage)) == len(latest) + 2
    # ... until it is older than max.compaction.lag.ms
    assert (await cleaner.run_once(base_ts + 7_200_000)).streams_cleaned == 1
    assert len(await read_all(storage)) == len(latest)
    # a dirty part above the ratio is cleaned at once
    await write_updates(storage, keys=20, rounds=3)
    await settle(storage)
    assert (await cleaner.run_once(late)).streams_cleaned == 1


async def test_a_pass_that_changes_nothing_leaves_no_objects_behind(storage: Storage) -> None:
    """Must survive: a pass over a log with nothing to clean (it may have written objects
    before knowing that) commits nothing and leaves no unreferenced object in the store."""
    for i in range(6):
        await produce(storage, [(b"a%d" % i, b"x" * 50), (b"b%d" % i, b"y" * 50)])
    await settle(storage)
    ranges = chunk_ranges(storage)
    cleaner = LogCleaner(storage, CleanerSettings(chunk_max_bytes=200, object_max_bytes=1))
    assert (await cleaner.run_once(NOW)).streams_cleaned == 0
    assert chunk_ranges(storage) == ranges
    stored = set(await storage.objects.list("stream/"))
    assert stored == {o.key for o in await storage.meta.objects("stream")}, "leaked objects"


async def test_cleaner_forgets_partitions_that_are_no_longer_compacted(storage: Storage) -> None:
    """Must survive: the cleaner's per-partition state does not outlive a deleted topic or a
    topic that stopped being compacted (no state growing with topic churn)."""
    await produce(storage, [(b"a", b"1"), (b"a", b"2")])
    await settle(storage)
    cleaner = LogCleaner(storage, CleanerSettings())
    await cleaner.run_once(NOW)
    assert set(cleaner.state) == {storage.stream_id("t", 0)}
    await storage.set_topic_configs("t", {"cleanup.policy": "delete"}, False)
    await cleaner.run_once(NOW)
    assert cleaner.state == {}
    await storage.set_topic_configs("t", dict(COMPACT), False)
    await cleaner.run_once(NOW)
    assert cleaner.state
    await storage.delete_topic("t")
    await cleaner.run_once(NOW)
    assert cleaner.state == {}


async def test_cleaning_keeps_the_event_loop_responsive(storage: Storage) -> None:
    """Must survive: decoding and filtering a partition (here 4 MiB chunks of 100-byte
    records) runs off the event loop, so the broker keeps answering while it cleans: less
    than half of the pass is spent in loop stalls of 50 ms or more (on the loop: 94-99%;
    off it: 16-25% on a busy 2-core machine, from garbage collection and scheduling)."""
    pending = []
    for b in range(500):
        batch = [(b"key-%05d" % ((b * 100 + i) % 10_000), b"x" * 100, []) for i in range(100)]
        data = encode_batch(batch, timestamp_ms=1_700_000_000_000)
        pending.append(storage.append("t", 0, data))
    await asyncio.gather(*pending)
    await Compactor(storage.log, CompactionSettings(
        min_age_ms=0, gc_delay_ms=0, chunk_max_bytes=4 << 20, max_bytes_per_run=1 << 30,
    )).run_once()
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.001)
            gaps.append(loop.time() - last)
            last = loop.time()

    tick = asyncio.create_task(ticker())
    started = time.monotonic()
    stats = await LogCleaner(storage, CleanerSettings()).run_once(NOW)
    elapsed = time.monotonic() - started
    done.set()
    await tick
    assert stats.records_removed == 40_000
    # the share of the pass the loop spent in stalls of 50 ms or more (an occasional garbage
    # collection or a busy machine makes some; decoding on the loop made them nearly all)
    stalled = sum(g for g in gaps if g >= 0.05) / elapsed
    print(f"stalled {stalled:.0%} of {elapsed * 1000:.0f} ms, worst {max(gaps) * 1000:.0f} ms")
    assert stalled < 0.5, f"event loop stalled {stalled:.0%} of the pass"


async def test_the_cleaning_checkpoint_survives_a_restart(tmp_path: Path) -> None:
    """Must survive: after a restart (new Storage and cleaner on the same object store and
    metadata) the cleaner knows which part is clean: a pass with little new data reads no
    chunk; tombstones kept before the restart are removed once delete.retention.ms has passed
    since the restart at the latest; a big enough dirty part is cleaned as usual."""
    storage = await open_storage(tmp_path)
    await storage.create_topic("t", 1, {**COMPACT})
    latest = await write_updates(storage, keys=20, rounds=4)
    await settle(storage)
    assert (await LogCleaner(storage, CleanerSettings()).run_once(NOW)).streams_cleaned == 1
    await produce(storage, [(b"k001", b"new")])  # a small dirty part
    await settle(storage)
    await storage.close()

    storage = await open_storage(tmp_path)
    try:
        cleaner = LogCleaner(storage, CleanerSettings())
        stats = await cleaner.run_once(NOW + 1000)
        assert stats.bytes_read == 0 and stats.streams_cleaned == 0
        assert (await cleaner.run_once(NOW + 1000 + RETENTION_MS - 1)).bytes_read == 0
        stats = await cleaner.run_once(NOW + 1000 + RETENTION_MS)
        assert stats.streams_cleaned == 1
        got = await read_all(storage)
        expected = {k: v for k, v in latest.items() if v[1] is not None}
        expected[b"k001"] = (got[-1].offset, b"new")
        assert {r.key: (r.offset, r.value) for r in got} == expected
        assert len(got) == len(expected)
    finally:
        await storage.close()
