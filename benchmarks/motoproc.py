"""moto's S3 server in its own process (objects in memory), for the S3 runs.

    python -m benchmarks.motoproc [--listen 127.0.0.1:0]

Prints `listening on HOST:PORT` once it accepts requests; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from moto.server import ThreadedMotoServer

# dummy credentials for moto; config files pointed away so no ~/.aws applies
MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:0")
    args = ap.parse_args()
    host, _, port = args.listen.rpartition(":")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=host, port=int(port), verbose=False)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    h, p = server.get_host_and_port()
    print(f"listening on {h}:{p}", flush=True)
    while not stop.wait(1.0):
        pass
    server.stop()


def _client(endpoint: str) -> Any:
    import boto3  # type: ignore[import-untyped]

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=MOTO_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=MOTO_ENV["AWS_SECRET_ACCESS_KEY"],
    )


def create_bucket(endpoint: str, bucket: str) -> None:
    c = _client(endpoint)
    try:
        c.create_bucket(Bucket=bucket)
    finally:
        c.close()


def empty_bucket(endpoint: str, bucket: str) -> None:
    """Delete every object of the bucket (moto keeps them in memory)."""
    c = _client(endpoint)
    try:
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                c.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    finally:
        c.close()


def object_sizes(endpoint: str, bucket: str, prefix: str = "") -> dict[str, int]:
    """Key -> size of every object under `prefix`."""
    c = _client(endpoint)
    try:
        out: dict[str, int] = {}
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                out[o["Key"]] = int(o["Size"])
        return out
    finally:
        c.close()


if __name__ == "__main__":
    main()
