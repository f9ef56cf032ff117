"""A minimal blocking Kafka client that speaks raw frames (for bad-input and wire tests).

Requests and responses are encoded with kio, the same schema-generated codecs real clients'
wire formats come from, so a test can send exactly the bytes it means to send.
"""

from __future__ import annotations

import datetime
import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_new_batch
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64


class RawClient:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def encode(self, req: Any) -> bytes:
        self.correlation += 1
        header_cls = RequestHeaderV2 if req.__flexible__ else RequestHeaderV1
        buf = io.BytesIO()
        entity_writer(header_cls)(
            buf,
            header_cls(
                request_api_key=req.__api_key__,
                request_api_version=req.__version__,
                correlation_id=i32(self.correlation),
                client_id="rawclient",
            ),
        )
        entity_writer(type(req))(buf, req)
        body = buf.getvalue()
        return struct.pack(">i", len(body)) + body

    def read_frame(self) -> bytes:
        size = struct.unpack(">i", self._read_exactly(4))[0]
        return self._read_exactly(size)

    def _read_exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed by broker")
            out += chunk
        return bytes(out)

    def decode(self, frame: bytes, api_key: int, version: int) -> tuple[int, Any]:
        resp_cls = load_response_schema(api_key, version)
        header, n = entity_reader(resp_cls.__header_schema__)(frame, 0)
        body, _m = entity_reader(resp_cls)(frame, n)
        return header.correlation_id, body

    def request(self, req: Any) -> Any:
        self.send_raw(self.encode(req))
        correlation, body = self.decode(self.read_frame(), req.__api_key__, req.__version__)
        assert correlation == self.correlation
        return body

    def is_closed_by_peer(self, wait: float = 5.0) -> bool:
        self.sock.settimeout(wait)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def request_class(api_key: int, version: int, name: str | None = None) -> Any:
    cls = load_request_schema(api_key, version)
    if name is None:
        return cls
    import sys

    return getattr(sys.modules[cls.__module__], name)


def make_batch(values: list[bytes], base_ts_ms: int = 1_700_000_000_000, producer_id: int = -1,
               producer_epoch: int = -1, base_sequence: int = -1) -> bytearray:
    """One uncompressed v2 batch with a correct CRC; record i has timestamp base + i seconds
    (whole seconds: kio's writer turns datetimes into milliseconds through a float)."""
    records = tuple(
        Record(
            attributes=i8(0),
            timestamp=TZAwareMicros.parse(
                datetime.datetime.fromtimestamp(base_ts_ms / 1000 + i, datetime.UTC)
            ),
            offset=i64(i),
            key=f"k{i}".encode(),
            value=v,
            headers=(RecordHeader(key=b"h", value=b"v"),),
        )
        for i, v in enumerate(values)
    )
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(producer_id),
            producer_epoch=i16(producer_epoch),
            base_sequence=i32(base_sequence),
            records=records,
            attributes=i16(0),
        ),
    )
    return bytearray(buf.getvalue())
