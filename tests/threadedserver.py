"""An asyncio TCP server running on its own event loop in a background thread, for test
doubles (proxies) that sit between real processes."""

from __future__ import annotations

import asyncio
import socket
import threading


class ThreadedServer:
    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _on_stop(self) -> None:
        """Runs on the loop before the connection tasks are cancelled."""

    def start_server(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, sock=self.sock)

        self.thread.start()
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def stop_server(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._on_stop()
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
