"""A TCP proxy for Kafka connections that can lose responses.

It forwards requests unchanged, reads the responses frame by frame, and when `drop(api_key)`
says so for a response, swallows it and cuts both connections: the request was processed but
the client never heard back, so it retries (what a network fault looks like to a producer).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable


class LossyProxy:
    def __init__(self, upstream: tuple[str, int], drop: Callable[[int], bool]) -> None:
        self.upstream = upstream
        self.drop = drop
        self.dropped = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> LossyProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, sock=self.sock)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # let their finally blocks run
            if self._server is not None:
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

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
