"""A small blocking Kafka client for floe's own command-line tools (kio codecs over a socket).

It speaks to any Kafka-compatible broker; the tools use it so that what they print is what
the broker answers over the protocol, exactly as for any other client.
"""

from __future__ import annotations

import io
import socket
import struct
import sys
import time
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32


class KafkaClientError(Exception):
    pass


MAX_FRAME = 64 << 20  # a response frame longer than this is refused unread


class Client:
    """One connection to a broker. The peer's bytes are not trusted: a response frame is at
    most `max_frame` bytes, and each whole response must arrive within `timeout` seconds (a
    slow trickle is a TimeoutError too). Not connecting is KafkaClientError."""

    def __init__(
        self, bootstrap: str, timeout: float = 10.0, client_id: str = "floe-cli",
        max_frame: int = MAX_FRAME,
    ) -> None:
        host, _, port = bootstrap.rpartition(":")
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as e:
            raise KafkaClientError(f"cannot connect to {bootstrap}: {e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client_id = client_id
        self.correlation = 0
        self.timeout = timeout
        self.max_frame = max_frame
        self._deadline = 0.0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        req_cls = load_request_schema(api_key, version)
        self.correlation += 1
        header_cls = RequestHeaderV2 if req_cls.__flexible__ else RequestHeaderV1
        buf = io.BytesIO()
        entity_writer(header_cls)(
            buf,
            header_cls(
                request_api_key=req_cls.__api_key__,
                request_api_version=req_cls.__version__,
                correlation_id=i32(self.correlation),
                client_id=self.client_id,
            ),
        )
        entity_writer(req_cls)(buf, req_cls(**fields))
        body = buf.getvalue()
        self._deadline = time.monotonic() + self.timeout
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        frame = self._read(struct.unpack(">i", self._read(4))[0])
        resp_cls = load_response_schema(api_key, version)
        header, n = entity_reader(resp_cls.__header_schema__)(frame, 0)
        if header.correlation_id != self.correlation:
            raise KafkaClientError("correlation id mismatch")
        return entity_reader(resp_cls)(frame, n)[0]

    def _read(self, n: int) -> bytes:
        if not 0 <= n <= self.max_frame:
            raise KafkaClientError(f"a response frame of {n} bytes (at most {self.max_frame})")
        out = bytearray()
        while len(out) < n:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole response within {self.timeout:g} s")
            self.sock.settimeout(left)
            chunk = self.sock.recv(min(n - len(out), 1 << 20))
            if not chunk:
                raise KafkaClientError("connection closed by the broker")
            out += chunk
        return bytes(out)


def nested(api_key: int, version: int, name: str, request: bool = True) -> Any:
    cls = (
        load_request_schema(api_key, version) if request else load_response_schema(api_key, version)
    )
    return getattr(sys.modules[cls.__module__], name)
