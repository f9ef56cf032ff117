"""A TCP proxy in front of an S3 endpoint whose behaviour can be switched while it runs:

- "pass":   bytes flow both ways unchanged
- "error":  every new request gets `HTTP/1.1 503 SlowDown` (or the status set) and the
            connection is closed
- "stall":  connections are accepted and nothing is ever answered

Switching mode drops every open connection, so keep-alive connections cannot bypass it.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.threadedserver import ThreadedServer

ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
    b"<Message>injected by the test</Message></Error>"
)


class S3FaultProxy(ThreadedServer):
    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self.upstream = upstream
        self.mode = "pass"
        self.status = (503, "SlowDown")
        self.requests_failed = 0
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._conns: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> S3FaultProxy:
        self.start_server()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_server()

    def _on_stop(self) -> None:
        self._drop()

    def set_mode(self, mode: str, status: tuple[int, str] = (503, "SlowDown")) -> None:
        def switch() -> None:
            self.mode, self.status = mode, status
            self._drop()

        self.loop.call_soon_threadsafe(switch)

    def _drop(self) -> None:
        for w in list(self._conns):
            w.transport.abort()
        self._conns.clear()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self._conns.add(cw)
        try:
            if self.mode == "stall":
                await asyncio.Event().wait()
            if self.mode == "error":
                await cr.readuntil(b"\r\n\r\n")
                self.requests_failed += 1
                code, name = self.status
                body = ERROR_BODY.replace(b"{code}", name.encode())
                cw.write(
                    f"HTTP/1.1 {code} {name}\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await cw.drain()
                return
            ur, uw = await asyncio.open_connection(*self.upstream)
            self._conns.add(uw)
            await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            cw.close()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()
