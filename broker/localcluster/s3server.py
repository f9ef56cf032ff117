"""An S3-compatible server for a local cluster (moto's, objects in memory), and the buckets.

moto is not a dependency of the broker: `pip install 'floe[local]'` (or the test extra) brings
it. moto accepts any credentials; the brokers get the dummy ones below, and the AWS config
files are pointed away so a developer's ~/.aws never applies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import urlencode

LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
# variables that would point the SDK elsewhere (a session, a profile, another endpoint)
UNSET_AWS_ENV = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
REGION = "us-east-1"


class MotoMissing(RuntimeError):
    pass


@contextmanager
def moto_s3(host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """moto's S3 server in a thread of this process; yields its endpoint URL (port 0: any)."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        raise MotoMissing(
            f"moto's S3 server is not installed ({e}): pip install 'floe[local]', or give "
            "--object-store an s3:// URL of a running S3-compatible store"
        ) from None
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    try:
        bound_host, bound_port = server.get_host_and_port()
        yield f"http://{bound_host}:{bound_port}"
    finally:
        server.stop()


def s3_url(bucket: str, prefix: str, endpoint: str) -> str:
    """The broker's s3:// URL form (`--object-store`, `--warehouse`) for an S3-compatible
    endpoint: path-style addressing (MinIO and moto need it), region us-east-1."""
    query = urlencode({"endpoint": endpoint, "region": REGION, "path_style": "true"}, safe=":/")
    return f"s3://{bucket}/{prefix}?{query}"


def create_buckets(endpoint: str | None, buckets: Iterable[str], env: Mapping[str, str]) -> None:
    """Create each bucket unless it exists. `env` holds the AWS credentials to use."""
    import boto3  # type: ignore[import-untyped]

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=env.get("AWS_DEFAULT_REGION") or REGION,
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
    )
    try:
        have = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        for bucket in buckets:
            if bucket not in have:
                client.create_bucket(Bucket=bucket)
    finally:
        client.close()
