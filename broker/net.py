"""The network layer: frames requests, dispatches them in order, writes responses in order.

Per connection, requests are decoded and handed to their handler one at a time in arrival
order; a handler may return `Later`, whose wait overlaps with the following requests, but
responses always leave in request order (librdkafka pipelines up to 5 produce requests).

Whatever goes wrong with one request (a frame that does not decode, a handler, a deferred
response or the response encoding that fails, even a task that dies) costs its connection
only: the connection is closed and one WARNING line says why (tracebacks go to DEBUG).
An ApiVersions request at a version the broker does not serve is answered in v0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections import deque
from typing import Any, cast

from broker._recvbuf import uninitialized
from broker.handlers import REGISTRY, BrokerContext, Later
from broker.handlers.api_versions import api_versions_response
from broker.handlers.produce import NO_RESPONSE
from broker.metrics import NetStats
from broker.protocol.codec import (
    ProtocolError,
    RequestHead,
    UnsupportedVersionError,
    decode_request,
    encode_response_parts,
    peek,
)

log = logging.getLogger(__name__)

# Receiving: frames up to SMALL_FRAME are cut out of one receive buffer of RECEIVE_BUFFER
# bytes (one copy each, as a transport's data_received would have cost); a larger one is read
# straight into a buffer of its own once its size prefix is here (no copy in this process but
# the first bytes that came with the prefix): a 1 MiB produce request was copied twice before
# (the transport's bytes, then joined), ~10% of the broker's CPU at full speed (issue 17).
RECEIVE_BUFFER = 128 * 1024
SMALL_FRAME = 32 * 1024
MAX_QUEUED_REQUESTS = 64  # received, not yet decoded frames per connection before we stop reading
# decoded requests whose answers are not yet written, per connection, before the next request
# waits to be decoded. Produce requests wait for their WAL flush (20-100 ms loaded), and
# librdkafka sends one per partition per linger.ms whatever is in flight: 64 made a 16-
# partition producer at 10 MiB/s (2,400 requests/s) queue in the socket (p99 0.6-1.1 s
# against 0.2-0.3 s, issue 17). What they hold is small (a head and a future: their records
# are the WAL's, bounded by wal.flush.max.bytes: s3stream/wal.py room()).
MAX_PENDING_REPLIES = 1024
API_VERSIONS = 18


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(
        self, ctx: BrokerContext, max_request_bytes: int, stats: NetStats | None = None
    ) -> None:
        self.ctx = ctx
        self.max_request_bytes = max_request_bytes
        self.stats = stats or NetStats()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_host = ""
        # receiving (asyncio.BufferedProtocol: the transport reads straight into our
        # buffers): `_buf[_start:_end]` are bytes received and not yet cut into frames; a
        # frame larger than SMALL_FRAME whose size prefix is here gets a buffer of its own,
        # `_big`, received up to `_big_got`
        self._buf = bytearray(RECEIVE_BUFFER)
        self._start = 0
        self._end = 0
        self._big: bytearray | None = None
        self._big_got = 0
        self._after_big = False  # the last frame was large (see get_buffer)
        # whole frames not yet decoded: bytearrays of their own (a Produce request's record
        # sets are written in place, broker/protocol/producerequest.py)
        self._inbox: deque[bytearray] = deque()
        self._inbox_ready = asyncio.Event()
        # the answers not yet written, in request order: (request head, response or future
        # of it, monotonic time the request was decoded); written by _send_ready as soon as
        # the first is ready, from the dispatch task or a future's callback (no task of its own)
        self._replies: deque[tuple[RequestHead, Any, float]] = deque()
        self._replies_room = asyncio.Event()  # set when fewer than MAX_PENDING_REPLIES wait
        self._replies_room.set()
        self._write_paused = False
        self._tasks: list[asyncio.Task[None]] = []
        self._reading_paused = False
        self._closing = False

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = f"/{peer[0]}" if peer else ""
        self.stats.connections_opened += 1
        self._tasks = [asyncio.create_task(self._dispatch(), name=f"dispatch {self.peer}")]
        for t in self._tasks:
            t.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """Whatever ends a connection's task unexpectedly ends that connection, never more."""
        if task.cancelled():
            return
        e = task.exception()
        if e is not None:
            self._close(f"{task.get_name()} failed: {_one_line(e)}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.stats.connections_closed += 1
        self._closing = True
        self._replies.clear()
        for t in self._tasks:
            t.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._send_ready()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the transport writes what it reads next: the rest of a large frame's own
        buffer, or the free end of the receive buffer."""
        if self._big is not None:
            return memoryview(self._big)[self._big_got:]
        if self._after_big and self._start == self._end:
            # the next frame is likely large too: its size prefix alone first, so that its
            # bytes go straight into its own buffer rather than through this one
            return memoryview(self._buf)[self._end : self._end + 4]
        if self._end == len(self._buf):  # full (not expected after _frames): make room
            self._to_front()
        return memoryview(self._buf)[self._end:]

    def _to_front(self) -> None:
        """Move what is not yet framed to the start of the receive buffer (a same-length
        slice assignment: the transport may hold a view of the buffer, so no resize)."""
        rest = self._buf[self._start : self._end]
        self._buf[: len(rest)] = rest
        self._start, self._end = 0, len(rest)

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` more were written where `get_buffer` said: queue the frames now whole."""
        if self._closing:
            return
        self.stats.bytes_in += nbytes
        big = self._big
        if big is not None:
            self._big_got += nbytes
            if self._big_got == len(big):
                self._big = None
                self._after_big = True
                self._inbox.append(big)
                self._queued()
            return
        self._end += nbytes
        self._frames()

    def _frames(self) -> None:
        """Queue the whole frames in the receive buffer (copied out: they are small); a large
        frame whose prefix is here moves to a buffer of its own. A size prefix is checked
        against max_request_bytes before anything is allocated for it."""
        view = memoryview(self._buf)
        pos, end = self._start, self._end
        while end - pos >= 4:
            size = int.from_bytes(view[pos : pos + 4], "big", signed=True)
            if size < 0 or size > self.max_request_bytes:
                self._close(f"request size {size} outside [0, {self.max_request_bytes}]")
                return
            have = end - pos - 4
            self._after_big = size > SMALL_FRAME
            if have >= size:
                self._inbox.append(bytearray(view[pos + 4 : pos + 4 + size]))
                pos += 4 + size
                continue
            if size > SMALL_FRAME:  # see broker/_recvbuf.c: no page of it resident yet
                try:
                    big = uninitialized(size)
                except MemoryError:
                    self._close(f"no memory for a request of {size} bytes")
                    return
                big[:have] = view[pos + 4 : end]
                self._big, self._big_got = big, have
                pos = end
            break
        view.release()
        self._start, self._end = (0, 0) if pos == end else (pos, end)
        if self._end and len(self._buf) - pos < SMALL_FRAME + 4:  # room for a small frame's rest
            self._to_front()
        self._queued()

    def _queued(self) -> None:
        if self._inbox:
            self._inbox_ready.set()
            if len(self._inbox) >= MAX_QUEUED_REQUESTS and self.transport is not None:
                self.transport.pause_reading()
                self._reading_paused = True

    # -- request processing ----------------------------------------------------------------
    def _close(self, why: str) -> None:
        if not self._closing:
            log.warning("closing connection from %s: %s", self.peer, why)
            self.stats.connections_dropped += 1
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    async def _dispatch(self) -> None:
        while True:
            while not self._inbox:
                self._inbox_ready.clear()
                await self._inbox_ready.wait()
            frame = self._inbox.popleft()
            if self._reading_paused and len(self._inbox) < MAX_QUEUED_REQUESTS // 2:
                assert self.transport is not None
                self.transport.resume_reading()
                self._reading_paused = False
            try:
                api_key = peek(frame)[0]
                registered = REGISTRY.get(api_key)
                supported = (registered.min_version, registered.max_version) if registered else None
                head, body = decode_request(frame, supported, self.peer_host)
            except UnsupportedVersionError as e:
                if e.api_key == API_VERSIONS:  # answer in v0 so the client can downgrade
                    head = RequestHead(API_VERSIONS, 0, e.correlation_id, None)
                    self.stats.request(API_VERSIONS, 0)
                    answer = api_versions_response(0, _unsupported_version())
                    await self._reply(head, answer, time.monotonic())
                    continue
                self._close(str(e))
                return
            except ProtocolError as e:
                self._close(str(e))
                return
            except Exception as e:  # a bad request costs its connection, never the broker
                self._close(f"undecodable request: {_one_line(e)}")
                return
            del frame
            began = time.monotonic()
            self.stats.request(api_key, head.api_version)
            try:
                result = await REGISTRY[api_key].handle(self.ctx, head, body)
            except Exception as e:
                log.debug("handler for api %d v%d failed", head.api_key, head.api_version,
                          exc_info=True)
                self._close(f"api {head.api_key} v{head.api_version} failed: {_one_line(e)}")
                return
            if result is NO_RESPONSE:
                self.stats.answered(api_key, time.monotonic() - began)
                continue
            if isinstance(result, Later):
                result = asyncio.ensure_future(result.coro)
                # if the connection goes first, nobody awaits it: its error is noted here
                result.add_done_callback(_note_unawaited_error)
            await self._reply(head, result, began)

    async def _reply(self, head: RequestHead, result: Any, began: float) -> None:
        """Queue an answer behind the earlier ones (waiting while MAX_PENDING_REPLIES do)."""
        while len(self._replies) >= MAX_PENDING_REPLIES:
            self._replies_room.clear()
            await self._replies_room.wait()
        self._replies.append((head, result, began))
        if isinstance(result, asyncio.Future) and not result.done():
            result.add_done_callback(self._on_done)
        self._send_ready()

    def _on_done(self, _fut: asyncio.Future[Any]) -> None:
        self._send_ready()

    def _send_ready(self) -> None:
        """Write the answers at the head of the queue that are ready, in request order; stop
        at the first one still waiting (its future's callback comes back here) or while the
        transport asks us to pause. What is ready goes out in one write (one system call for
        all the answers a WAL commit releases at once)."""
        replies = self._replies
        ready: list[bytes | bytearray | memoryview] = []
        transport = self.transport
        while replies and not self._write_paused:
            if self._closing or transport is None or transport.is_closing():
                replies.clear()
                return
            head, result, began = replies[0]
            try:
                if isinstance(result, asyncio.Future):
                    if not result.done():
                        break
                    result = result.result()
                frame, size = encode_response_parts(
                    head.api_key, head.api_version, head.correlation_id, result
                )
            except (Exception, asyncio.CancelledError) as e:
                log.debug("api %d v%d failed", head.api_key, head.api_version, exc_info=True)
                transport.writelines(ready)  # the answers before it still go out
                self._close(f"api {head.api_key} v{head.api_version} failed: {_one_line(e)}")
                replies.clear()
                return
            replies.popleft()
            ready += frame  # record sets are written without a copy
            self.stats.bytes_out += size
            self.stats.answered(head.api_key, time.monotonic() - began)
        if ready:
            assert transport is not None
            transport.writelines(ready)
        if len(replies) < MAX_PENDING_REPLIES:
            self._replies_room.set()


def _note_unawaited_error(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("deferred response failed: %s", _one_line(fut.exception() or Exception()))


def _one_line(e: BaseException) -> str:
    """An exception and where it was raised, on one line (the traceback goes to DEBUG)."""
    where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}" if where else ""
    return f"{e!r}{at}"[:500]


def _unsupported_version() -> Any:
    from broker.errors import ErrorCode

    return ErrorCode.unsupported_version


async def serve(
    ctx: BrokerContext,
    host: str,
    port: int,
    max_request_bytes: int,
    stats: NetStats | None = None,
) -> asyncio.Server:
    """Listen for Kafka clients; every connection counts into `stats` (one broker's)."""
    loop = asyncio.get_running_loop()
    stats = stats or NetStats()
    server = await loop.create_server(
        lambda: KafkaConnection(ctx, max_request_bytes, stats),
        host,
        port,
        reuse_address=True,
        backlog=1024,
    )
    return server


async def close_server(server: asyncio.Server) -> None:
    server.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server.wait_closed(), 2)
