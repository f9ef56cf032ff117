"""A TCP proxy for Kafka connections that can lose responses.

It forwards requests unchanged, reads the responses frame by frame, and when `drop(api_key)`
says so for a response, swallows it and cuts both connections: the request was processed but
the client never heard back, so it retries (what a network fault looks like to a producer).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable

from tests.threadedserver import ThreadedServer


class LossyProxy(ThreadedServer):
    def __init__(self, upstream: tuple[str, int], drop: Callable[[int], bool]) -> None:
        super().__init__()
        self.upstream = upstream
        self.drop = drop
        self.dropped = 0

    def start(self) -> LossyProxy:
        self.start_server()
        return self

    def stop(self) -> None:
        self.stop_server()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            cw.close()
            return
        api_of: dict[int, int] = {}
        to_broker = asyncio.ensure_future(self._requests(cr, uw, api_of))
        try:
            while True:
                head = await ur.readexactly(4)
                frame = await ur.readexactly(struct.unpack(">i", head)[0])
                correlation = struct.unpack_from(">i", frame, 0)[0]
                api_key = api_of.pop(correlation, -1)
                if self.drop(api_key):
                    self.dropped += 1
                    break
                cw.write(head + frame)
                await cw.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            to_broker.cancel()
            for w in (cw, uw):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    async def _requests(self, cr: asyncio.StreamReader, uw: asyncio.StreamWriter,
                        api_of: dict[int, int]) -> None:
        try:
            while True:
                head = await cr.readexactly(4)
                frame = await cr.readexactly(struct.unpack(">i", head)[0])
                api_key, _version, correlation = struct.unpack_from(">hhi", frame, 0)
                api_of[correlation] = api_key
                uw.write(head + frame)
                await uw.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            uw.close()
