"""How one Fetch reads its partitions (broker.handlers.fetch): reads start ahead of their
turn within the fetch's byte budget, answers are cut to the budget in whole batches (the first
batch of a response always served), and a partition whose read is slow is answered empty only
when the response has records to give meanwhile."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import pytest

from broker.engine import StorageEngine
from broker.handlers import fetch
from broker.protocol import records
from broker.protocol.recordset import RecordSet, RecordSetBuilder
from tests.rawclient import make_batch


def batch(base: int, n: int) -> bytes:
    buf = make_batch([f"v{base + i}".encode() * 10 for i in range(n)])
    records.assign_offsets(buf, records.validate(buf), base, None)
    return bytes(buf)


@dataclass(frozen=True)
class Wanted:
    partition: int
    fetch_offset: int = 0
    partition_max_bytes: int = 100


class SlowStorage:
    """read() of partition p waits for gates[p] and answers data[p]; started: in call order
    (asked: the bytes each read asked for). Every partition has records from offset 0 to
    ends[p] (default 1)."""

    def __init__(
        self,
        data: dict[int, bytes],
        ends: dict[int, int] | None = None,
        positions: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        self.data = data
        self.ends = ends or {}
        self.positions = positions or {}  # log_position: none unless given
        self.gates = {p: asyncio.Event() for p in data}
        self.started: list[int] = []
        self.asked: dict[int, int] = {}

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, self.ends.get(partition, 1)

    def log_position(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[int, int] | None:
        return self.positions.get(partition)

    async def read_records(
        self, topic: str, partition: int, offset: int, max_bytes: int, must_return_one: bool
    ) -> RecordSet:
        self.started.append(partition)
        self.asked[partition] = max_bytes
        await self.gates[partition].wait()
        return record_set(self.data[partition])


def got(read: object) -> bytes:
    assert isinstance(read, RecordSet)
    return read.tobytes()


def reads(storage: SlowStorage, n: int, budget: int, partition_max: int = 100) -> Any:
    parts = [("t", Wanted(p, 0, partition_max)) for p in range(n)]
    return fetch._Reads(cast(StorageEngine, storage), parts, budget)


def record_set(data: bytes) -> RecordSet:
    """The batches of `data` as a RecordSet of views, as Storage.read_records serves them."""
    out = RecordSetBuilder()
    for h in records.iter_headers(data):
        out.add(data, h)
    return out.build()


def test_within_cuts_whole_batches_and_keeps_a_first_one() -> None:
    a, b = batch(0, 2), batch(2, 2)
    ab = record_set(a + b)
    assert ab.within(len(a) + len(b), False).tobytes() == a + b
    assert ab.within(len(a) + 1, False).tobytes() == a
    assert ab.within(1, False).tobytes() == b""
    assert ab.within(1, True).tobytes() == a  # KIP-74: the first batch even if too big


async def test_reads_start_ahead_within_the_budget() -> None:
    storage = SlowStorage({p: batch(p, 1) for p in range(5)})
    r = reads(storage, 5, 300)  # each partition may bring 100
    storage.gates[0].set()
    assert got(await r.result(0, 300, False)) == storage.data[0]
    await asyncio.sleep(0)
    assert storage.started == [0, 1, 2]  # 0's 100 bytes and two more fill the 300


async def test_a_slow_read_is_skipped_only_when_records_are_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch, "SERVE_WITHIN_S", 0.01)
    storage = SlowStorage({p: batch(p, 1) for p in range(3)})
    r = reads(storage, 3, 1000)
    storage.gates[1].set()  # partition 1 is ready, 0 is slow
    assert got(await r.result(0, 1000, False)) == b""  # skipped: 1 has records for this response
    assert got(await r.result(1, 1000, False)) == storage.data[1]
    third = asyncio.ensure_future(r.result(2, 999, False))  # nothing else ready: it waits
    await asyncio.sleep(0.05)
    assert not third.done()
    storage.gates[2].set()
    assert got(await third) == storage.data[2]


async def test_reads_still_under_way_keep_their_share_of_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition skipped because its read is slow keeps that read's bytes counted: the
    partitions after it get no read of their own past the budget (before, each skipped
    partition freed room for one more read, so a fetch of 100 partitions whose reads were slow
    started them all, and the next fetch read the same offsets again)."""
    monkeypatch.setattr(fetch, "SERVE_WITHIN_S", 0.01)
    storage = SlowStorage({p: batch(p, 1) for p in range(10)})
    r = reads(storage, 10, 300)  # three reads of 100 fill the budget
    storage.gates[1].set()
    total = 0
    for i in range(10):
        total += len(got(await r.result(i, 300 - total, total > 0)))
    assert total == len(storage.data[1])  # 1 answered; 0 and 2 still reading
    await asyncio.sleep(0)  # every read started has begun
    assert storage.started == [0, 1, 2, 3]  # 1's answer made room for one read, no more


async def test_reads_ask_for_an_even_share_among_the_partitions_with_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each read asks for the fetch's budget shared evenly among the partitions with records
    past their fetch offset (at most its partition_max_bytes, at least SHARE_FLOOR), so the
    reads of a fetch cover the same stretch of the log (one GET per WAL object between them);
    a partition at its end takes no share, and one alone with records asks for all it may."""
    monkeypatch.setattr(fetch, "SHARE_FLOOR", 10)
    storage = SlowStorage({p: batch(p, 1) for p in range(4)}, ends={1: 0, 3: 0})
    for p in storage.gates:
        storage.gates[p].set()
    r = reads(storage, 4, 1200, partition_max=1000)
    for i in range(4):
        await r.result(i, 1200, False)
    assert storage.asked[0] == storage.asked[2] == 600  # 1 and 3 at their end take no share

    alone = SlowStorage({p: batch(p, 1) for p in range(4)}, ends={1: 0, 2: 0, 3: 0})
    for p in alone.gates:
        alone.gates[p].set()
    await reads(alone, 4, 1200, partition_max=1000).result(0, 1200, False)
    assert alone.asked[0] == 1000  # its partition_max_bytes: the others have nothing to read

    floor = SlowStorage({p: batch(p, 1) for p in range(4)})
    for p in floor.gates:
        floor.gates[p].set()
    monkeypatch.setattr(fetch, "SHARE_FLOOR", 500)
    await reads(floor, 4, 1200, partition_max=1000).result(0, 1200, False)
    assert floor.asked[0] == 500  # 1200 / 4 is below the floor


async def test_partitions_ahead_in_the_log_read_one_batch_until_the_others_catch_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition whose read would start in a WAL object past the last one the
    furthest-behind partition's read needs reads one batch (HELD_BACK_BYTES) this fetch; the
    others keep their even share. Partitions answered from memory (no position) are never
    held back, nor are partitions whose reads overlap the furthest-behind one's, nor those
    so far ahead that they are elsewhere in the log (a replay of one topic must not slow
    the reads of another)."""
    monkeypatch.setattr(fetch, "SHARE_FLOOR", 10)
    far = 14 + fetch.HOLD_WITHIN_OBJECTS + 1  # elsewhere in the log, not drifted: not held
    positions = {0: (10, 14), 1: (12, 16), 2: (15, 19), 4: (40, 44), 5: (far, far + 4)}
    storage = SlowStorage({p: batch(p, 1) for p in range(6)}, positions=positions)  # 3: cached
    for p in storage.gates:
        storage.gates[p].set()
    r = reads(storage, 6, 1200, partition_max=1000)
    for i in range(6):
        await r.result(i, 1200, False)
    assert r.held == {2, 4}
    assert storage.asked == {0: 200, 1: 200, 2: fetch.HELD_BACK_BYTES, 3: 200,
                             4: fetch.HELD_BACK_BYTES, 5: 200}

    # one partition with a position, or none: nothing to keep together
    lone = SlowStorage({p: batch(p, 1) for p in range(2)}, positions={1: (40, 44)})
    assert reads(lone, 2, 1000, partition_max=1000).held == set()
