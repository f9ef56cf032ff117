"""S3 endpoints for tests: moto's S3 server (broker.localcluster.s3server: the real S3 HTTP API,
objects in memory), a server that accepts connections and never answers, and one that answers
every request with a fixed S3 error."""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from broker.localcluster.s3server import LOCAL_AWS_ENV, UNSET_AWS_ENV, moto_s3

# dummy credentials; the config files are pointed away so a developer's ~/.aws never applies
TEST_AWS_ENV = LOCAL_AWS_ENV
__all__ = [
    "TEST_AWS_ENV",
    "UNSET_AWS_ENV",
    "broker_on_s3",
    "bucket_listing",
    "error_endpoint",
    "moto_s3",
    "stalled_endpoint",
]


@contextmanager
def stalled_endpoint() -> Iterator[str]:
    """Accepts TCP connections, reads nothing, answers nothing. Closing it drops them all."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.05)  # a blocked accept() would not notice the close below
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        lsock.close()
        for c in conns:
            c.close()


@contextmanager
def error_endpoint(status: int, code: str) -> Iterator[tuple[str, list[str]]]:
    """Answers every request with an S3 error document; yields (endpoint, requests seen)."""
    seen: list[str] = []
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected {code}</Message><RequestId>1</RequestId></Error>"
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # answers botocore's "Expect: 100-continue" at once

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_DELETE = do_HEAD = do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def bucket_listing(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """Every key in the bucket under `prefix`, listed with a plain boto3 client."""
    import boto3

    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        keys: list[str] = []
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return keys
    finally:
        c.close()


_bucket_ids = itertools.count()


def broker_on_s3(endpoint: str, prefix: str = "floe-test") -> tuple[list[str], dict[str, str]]:
    """A fresh bucket on `endpoint`, and the broker flags and environment that put a broker's
    log in it (environment values "" unset the variable, see tests/brokerproc.py)."""
    import boto3

    bucket = f"{prefix}-{next(_bucket_ids)}-{os.getpid()}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    args = ["--object-store", f"s3://{bucket}/log?endpoint={endpoint}&region=us-east-1"]
    return args, {**TEST_AWS_ENV, **dict.fromkeys(UNSET_AWS_ENV, "")}
