"""The network layer's answers (broker/net.py `_reply`/`_send_ready`) and produce's durability
wait (broker/handlers/base.py `when_done`).

What must hold:
- answers leave in request order whatever order their futures finish in, and what is ready
  at once goes out in one write;
- while the transport asks us to pause, nothing is written; on resume, all that is ready;
- an answer whose future fails closes the connection, after the answers before it;
- when_done calls finish once: when every future is done, or at the timeout (then seeing the
  rest not done, and no longer called back by them); an error in finish is the future's;
- a Produce round trip through the real connection, handler and (null) engine leaves no
  reference cycle behind: its objects go by reference counting, not by the cyclic GC
  (closures calling each other did: ~27 objects per request, whose collections then cost
  more than the requests, issue 17).
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import struct
from typing import Any

import pytest
from kio.schema.produce.v9.request import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from kio.schema.types import TopicName
from kio.static.primitive import i16, i32, i32Timedelta

from broker.handlers import BrokerContext
from broker.handlers.api_versions import api_versions_response
from broker.handlers.base import when_done
from broker.net import SMALL_FRAME, KafkaConnection
from broker.protocol.codec import RequestHead
from tests.rawclient import make_batch
from tests.unit.test_apitypes import frame_of
from tests.unit.test_net_framing import feed


class _Transport:
    def __init__(self) -> None:
        self.writes: list[list[Any]] = []
        self.closed = False

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if key == "peername" else default

    def writelines(self, parts: list[Any]) -> None:
        self.writes.append([bytes(p) for p in parts])

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _correlation_ids(t: _Transport) -> list[list[int]]:
    """Per write, the correlation ids of the response frames in it."""
    out = []
    for parts in t.writes:
        data = b"".join(parts)
        ids, pos = [], 0
        while pos < len(data):
            size, cid = struct.unpack_from(">ii", data, pos)
            ids.append(cid)
            pos += 4 + size
        out.append(ids)
    return out


def _conn() -> tuple[KafkaConnection, _Transport]:
    conn = KafkaConnection(ctx=None, max_request_bytes=1 << 20)  # type: ignore[arg-type]
    t = _Transport()
    conn.transport = t  # type: ignore[assignment]
    return conn, t


def _head(cid: int) -> RequestHead:
    return RequestHead(18, 3, cid, None)


async def test_answers_leave_in_request_order_and_together() -> None:
    conn, t = _conn()
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(4)]
    for cid, f in enumerate(futures):
        await conn._reply(_head(cid), f, 0.0)
    for f in (futures[3], futures[2], futures[1]):  # the last ones first
        f.set_result(api_versions_response(3))
    await asyncio.sleep(0)
    assert t.writes == []  # all wait for the first
    futures[0].set_result(api_versions_response(3))
    await asyncio.sleep(0)
    assert _correlation_ids(t) == [[0, 1, 2, 3]]  # in order, in one write
    await conn._reply(_head(4), api_versions_response(3), 0.0)  # ready at once: written
    assert _correlation_ids(t) == [[0, 1, 2, 3], [4]]


async def test_nothing_is_written_while_paused() -> None:
    conn, t = _conn()
    conn.pause_writing()
    await conn._reply(_head(1), api_versions_response(3), 0.0)
    await conn._reply(_head(2), api_versions_response(3), 0.0)
    assert t.writes == []
    conn.resume_writing()
    assert _correlation_ids(t) == [[1, 2]]


async def test_a_failed_answer_closes_the_connection_after_those_before_it() -> None:
    conn, t = _conn()
    loop = asyncio.get_running_loop()
    first, failing, after = loop.create_future(), loop.create_future(), loop.create_future()
    for cid, f in enumerate((first, failing, after)):
        await conn._reply(_head(cid), f, 0.0)
    failing.set_exception(RuntimeError("boom"))
    after.set_result(api_versions_response(3))
    first.set_result(api_versions_response(3))
    await asyncio.sleep(0)
    assert _correlation_ids(t) == [[0]]  # the answer before it, then no more
    assert t.closed and not conn._replies


async def test_when_done_waits_for_every_future() -> None:
    loop = asyncio.get_running_loop()
    a, b = loop.create_future(), loop.create_future()
    calls: list[tuple[bool, bool]] = []
    out = when_done([a, b], 10.0, lambda: calls.append((a.done(), b.done())) or "answer")
    a.set_result(1)
    await asyncio.sleep(0)
    assert not out.done() and calls == []
    b.set_result(2)
    assert await asyncio.wait_for(out, 1) == "answer"
    assert calls == [(True, True)]


async def test_when_done_answers_at_the_timeout_and_forgets_the_rest() -> None:
    loop = asyncio.get_running_loop()
    done, stuck = loop.create_future(), loop.create_future()
    done.set_result(1)
    seen: list[bool] = []
    out = when_done([done, stuck], 0.05, lambda: seen.append(stuck.done()) or "late")
    assert await asyncio.wait_for(out, 2) == "late"
    assert seen == [False]
    stuck.set_result(2)  # no callback left on it: finish is not called again
    await asyncio.sleep(0)
    assert seen == [False]


async def test_when_done_with_nothing_to_wait_for_and_a_failing_finish() -> None:
    assert await when_done([], 1.0, lambda: 7) == 7

    def broken() -> int:
        raise ValueError("no answer")

    with pytest.raises(ValueError, match="no answer"):
        await when_done([], 1.0, broken)


def _produce_frame(values: tuple[bytes, ...] = (b"a", b"b", b"c")) -> bytes:
    batch = bytes(make_batch(list(values)))
    req = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            TopicProduceData(
                name=TopicName("t"),
                partition_data=(PartitionProduceData(index=i32(0), records=batch),),
            ),
        ),
    )
    frame = frame_of(req, 0, 9)
    return len(frame).to_bytes(4, "big") + frame


async def test_large_produce_requests_are_received_in_their_own_buffer(
    ctx: BrokerContext,
) -> None:
    """A request larger than SMALL_FRAME is read straight into a buffer of its own, handed
    to the decoder read-only (kio refuses a writable one: seen failing, every connection of
    a full-speed producer closed): answered like any other, and small ones after it."""
    conn = KafkaConnection(ctx, 8 << 20)
    t = _Transport()
    conn.connection_made(t)  # type: ignore[arg-type]
    big = _produce_frame((b"x" * SMALL_FRAME, b"y" * 70000, b"z"))
    small = _produce_frame()
    assert len(big) > 2 * SMALL_FRAME
    stream = big + small + big + big
    feed(conn, stream[:10], 3)  # the prefix in pieces, then reads of a few KiB
    feed(conn, stream[10:], 5000)
    for _ in range(1000):
        if sum(len(ids) for ids in _correlation_ids(t)) >= 4:
            break
        await asyncio.sleep(0)
    assert not t.closed
    assert sum(len(ids) for ids in _correlation_ids(t)) == 4
    assert conn._big is None and conn._start == conn._end
    conn.connection_lost(None)


async def test_a_produce_round_trip_leaves_no_reference_cycle(ctx: BrokerContext) -> None:
    conn = KafkaConnection(ctx, 1 << 20)
    t = _Transport()
    conn.connection_made(t)  # type: ignore[arg-type]
    frame = _produce_frame()

    async def produce(n: int) -> None:
        want = sum(len(ids) for ids in _correlation_ids(t)) + n
        for _ in range(n):
            feed(conn, frame)
        for _ in range(1000):
            if sum(len(ids) for ids in _correlation_ids(t)) >= want:
                return
            await asyncio.sleep(0)
        raise AssertionError("no answers")

    await produce(20)  # warm: first-use caches
    gc.collect()
    gc.disable()
    try:
        await produce(200)
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert not t.closed
    assert unreachable == 0, f"{unreachable} objects in reference cycles after 200 produces"
    conn.connection_lost(None)
