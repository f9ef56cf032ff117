"""The log cleaner and transactions: records of aborted transactions are no key's latest value
and are removed, markers stay, and nothing at or beyond the last stable offset (an open
transaction) is cleaned. Read back as a read_committed consumer does (tabletopic.txnfilter).
On the local object store and on S3 (moto's server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.logcleaner import CleanerSettings, LogCleaner
from broker.protocol import records
from broker.storage import Storage
from tabletopic.columnar import Parts, decode_columns
from tabletopic.txnfilter import committed_batches
from tests.s3server import broker_on_s3
from tests.unit.test_logcleaner import COMPACT, open_storage, read_all, settle
from tests.unit.test_txn_coordinator import txn_batch


@pytest.fixture(params=["file", "s3"])
async def storage(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Storage]:
    """The cleaner deletes data: run on the local object store and on S3 (moto's server)."""
    url = None
    if request.param == "s3":
        args, env = broker_on_s3(request.getfixturevalue("s3_server"))
        for k, v in env.items():
            if v:
                monkeypatch.setenv(k, v)
            else:
                monkeypatch.delenv(k, raising=False)
        url = args[args.index("--object-store") + 1]
    s = await open_storage(tmp_path, objects_url=url)
    await s.create_topic("t", 1, {**COMPACT, "min.cleanable.dirty.ratio": "0.01"})
    yield s
    await s.close()


async def write(storage: Storage, value: bytes, pid: int, seq: int) -> int:
    """One transactional record of key k0."""
    return (await storage.append("t", 0, txn_batch([value], pid, 0, seq))).base_offset


async def end(storage: Storage, pid: int, commit: bool) -> int:
    return (await storage.append_marker("t", 0, pid, 0, commit, 0)).base_offset


async def read_committed(storage: Storage) -> list[tuple[int, bytes | None]]:
    """What a table topic's writer reads, from the read joined and (as the writer takes it)
    in the parts the storage holds it in: the same batches."""
    lso = storage.last_stable_offset("t", 0)
    data = await storage.read("t", 0, 0, 1 << 20, True)
    got = committed_batches(storage, "t", 0, data, 0, lso)
    parts = Parts((await storage.read_records("t", 0, 0, 1 << 20, True)).parts)
    in_parts = committed_batches(storage, "t", 0, parts, 0, lso)
    assert in_parts == got
    return [] if got is None else [(r.offset, r.value)
                                   for r in decode_columns(data, got.batches, 0).records()]


def markers(data: bytes) -> list[int]:
    return [h.base_offset for h in records.iter_headers(data) if h.is_control]


async def test_aborted_values_are_removed_and_open_transactions_left_alone(
    storage: Storage,
) -> None:
    """Must survive: a committed v1, an aborted v2 of the same key, cleaned: v1 stays (read
    committed and uncommitted), v2 is gone, both markers are kept. An open transaction's v3
    of that key does not displace v1 while open; once committed and cleaned, v3 alone."""
    pid, _ = await storage.init_producer_id(-1, -1)
    assert await write(storage, b"v1", pid, 0) == 0
    assert await end(storage, pid, commit=True) == 1
    assert await write(storage, b"v2", pid, 1) == 2
    assert await end(storage, pid, commit=False) == 3
    assert await read_committed(storage) == [(0, b"v1")]
    # each append a WAL object of its own: the read in parts (the markers in other parts)
    assert len((await storage.read_records("t", 0, 0, 1 << 20, True)).parts) == 4
    await settle(storage)
    cleaner = LogCleaner(storage, CleanerSettings())
    stats = await cleaner.run_once()
    assert stats.streams_cleaned == 1 and stats.records_removed == 1
    assert await read_committed(storage) == [(0, b"v1")]
    assert [(r.offset, r.value) for r in await read_all(storage)] == [(0, b"v1")]
    assert markers(await storage.read("t", 0, 0, 1 << 20, True)) == [1, 3]

    other, _ = await storage.init_producer_id(-1, -1)
    assert await write(storage, b"v3", other, 0) == 4  # open: the LSO stays at 4
    await settle(storage)
    await cleaner.run_once()
    assert storage.last_stable_offset("t", 0) == 4
    assert await read_committed(storage) == [(0, b"v1")]
    assert [r.value for r in await read_all(storage)] == [b"v1", b"v3"]

    assert await end(storage, other, commit=True) == 5
    await settle(storage)
    stats = await cleaner.run_once()
    assert stats.records_removed == 1
    assert await read_committed(storage) == [(4, b"v3")]
    assert markers(await storage.read("t", 0, 0, 1 << 20, True)) == [1, 3, 5]


async def test_a_writer_reading_in_parts_sees_an_abort_marker_of_a_later_part(
    storage: Storage,
) -> None:
    """Must survive: a producer's aborted transaction ends at its ABORT marker (in a part of
    the read after the first), so its next, committed, transaction is read: the marker is
    found in its own part (tabletopic.columnar.Parts), not only in the joined read."""
    pid, _ = await storage.init_producer_id(-1, -1)
    assert await write(storage, b"gone", pid, 0) == 0
    assert await end(storage, pid, commit=False) == 1
    assert await write(storage, b"kept", pid, 1) == 2
    assert await end(storage, pid, commit=True) == 3
    assert len((await storage.read_records("t", 0, 0, 1 << 20, True)).parts) == 4
    assert await read_committed(storage) == [(2, b"kept")]
