"""An idempotent producer pipelining requests across a failed WAL flush.

What must survive: when a flush fails, the producer's sequence state falls back to what is
durable at that very moment, so a pipelined batch arriving right after the failure (before any
callback ran) is refused as out of order instead of being accepted against the failed batches;
after the client's retries every acknowledged record is in the log once, in sequence order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from broker.errors import ErrorCode, KafkaError
from broker.protocol import records
from broker.protocol.recordcodec import decode_records
from broker.storage import AppendResult, Storage
from s3stream.log import WalSettings
from s3stream.metadata import SqliteMetadataStore
from s3stream.objectstore import MemoryObjectStore
from tests.faults import FaultyStore
from tests.rawclient import make_batch


class FailOnce(FaultyStore):
    """Stalls PUTs while `stall` is clear (setting `at_put` when one waits); once `fail_next`
    is set the next PUT fails, and `on_failure` is scheduled (call_soon) as it raises: that is
    a request read from a socket in the loop iteration right after the failure."""

    def __init__(self) -> None:
        super().__init__(MemoryObjectStore())
        self.at_put = asyncio.Event()
        self.fail_next = False
        self.on_failure: Callable[[], None] | None = None

    async def put(self, key: str, data: bytes | memoryview) -> None:
        if not self.stall.is_set():
            self.at_put.set()
        await self.stall.wait()
        if self.fail_next:
            self.fail_next = False
            if self.on_failure is not None:
                asyncio.get_running_loop().call_soon(self.on_failure)
            raise self.error
        await self.inner.put(key, data)


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[tuple[Storage, FailOnce]]:
    store = FailOnce()
    s = Storage(store, SqliteMetadataStore(tmp_path / "meta.db"), WalSettings(flush_interval_ms=1))
    await s.open()
    await s.create_topic("t", 1, {})
    yield s, store
    await s.close()


async def outcome(f: asyncio.Future[AppendResult]) -> int | KafkaError:
    try:
        return (await asyncio.wait_for(f, 5)).base_offset
    except KafkaError as e:
        return e


def append(s: Storage, data: bytes) -> asyncio.Future[AppendResult]:
    """A produce request as the handler makes it: a refusal is an already failed future."""
    try:
        return s.append("t", 0, data)
    except KafkaError as e:
        f: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        f.set_exception(e)
        return f


async def test_pipelined_batch_after_a_failed_flush_keeps_sequence_order(
    storage: tuple[Storage, FailOnce],
) -> None:
    s, store = storage
    pid, epoch = await s.init_producer_id(-1, -1)
    batches = [bytes(make_batch([f"v{i}".encode()], producer_id=pid, producer_epoch=epoch,
                                base_sequence=i)) for i in range(6)]
    store.stall.clear()
    futs = [append(s, batches[0])]
    await asyncio.wait_for(store.at_put.wait(), 5)  # seq 0's flush waits in its PUT
    futs += [append(s, b) for b in batches[1:5]]  # four more requests in flight
    late: list[asyncio.Future[AppendResult]] = []
    store.on_failure = lambda: late.append(append(s, batches[5]))  # the fifth in-flight slot
    store.fail_next = True
    store.stall.set()
    first = [await outcome(f) for f in futs]
    assert all(isinstance(r, KafkaError) and r.code == ErrorCode.kafka_storage_error
               for r in first), first
    (late_result,) = [await outcome(f) for f in late]
    # the client retries what failed, in sequence order (librdkafka does the same)
    acked: dict[int, int] = {}
    if isinstance(late_result, int):
        acked[5] = late_result
    else:
        assert late_result.code == ErrorCode.out_of_order_sequence_number, late_result
    for seq in range(6):
        if seq in acked:
            continue
        r = await outcome(append(s, batches[seq]))
        assert isinstance(r, int), f"retry of sequence {seq} refused: {r}"
        acked[seq] = r
    data = await s.read("t", 0, 0, 1 << 20, must_return_one=True)
    log = [(r.offset, r.value) for h in records.iter_headers(data) for r in decode_records(data, h)]
    assert log == [(acked[i], f"v{i}".encode()) for i in range(6)], \
        f"log {log} is not the sequence order, acked at {acked}"
