"""The warehouse URL (where table files go) and the FileIO settings it implies.

    file:///DIR (or a plain path)    a local directory (every file fsynced before the commit,
                                     see tabletopic.fileio)
    s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=R&path_style=true
                                     S3 or any S3-compatible store (MinIO, moto, ...)

An S3 warehouse takes the query parameters of the broker's `--object-store` URL, parsed by the
same code (`s3stream.s3.S3Settings.from_url`); only `endpoint`, `region`, `path_style` and the
timeouts mean something here. The query is never part of the table location: the catalog sees
`s3://BUCKET/PREFIX`, the settings reach pyiceberg's FileIO as `s3.*` properties and Spark's
Iceberg catalog as S3FileIO properties. Credentials are never in the URL: pyiceberg's FileIO
(pyarrow, the AWS SDK's default chain) and Spark's S3FileIO find them in the AWS environment
(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profiles, instance roles), as the object store does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

DURABLE_FILE_IO = "tabletopic.fileio.DurableFileIO"  # pyiceberg imports it by this name
# pyiceberg FileIO property names (pyiceberg.io); spelled out so that a rename shows up here
PY_IO_IMPL = "py-io-impl"
S3_ENDPOINT = "s3.endpoint"
S3_REGION = "s3.region"
S3_FORCE_VIRTUAL_ADDRESSING = "s3.force-virtual-addressing"
S3_CONNECT_TIMEOUT = "s3.connect-timeout"
S3_REQUEST_TIMEOUT = "s3.request-timeout"
# Iceberg Java (Spark) catalog properties
JAVA_S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"


@dataclass(frozen=True)
class S3Access:
    """How to reach an S3-compatible warehouse (None: the SDK's default)."""

    endpoint: str | None
    region: str | None
    path_style: bool
    connect_timeout: float
    request_timeout: float


@dataclass(frozen=True)
class Warehouse:
    location: str  # the URL without its query: what the catalog and the table metadata hold
    s3: S3Access | None  # set for s3:// warehouses

    def fileio_properties(self) -> dict[str, str]:
        """pyiceberg catalog properties: the FileIO every table of the catalog is opened with
        (DurableFileIO, a PyArrowFileIO) and how it reaches S3."""
        props = {PY_IO_IMPL: DURABLE_FILE_IO}
        if self.s3 is not None:
            if self.s3.endpoint:
                props[S3_ENDPOINT] = self.s3.endpoint
            if self.s3.region:
                props[S3_REGION] = self.s3.region
            if self.s3.path_style:
                props[S3_FORCE_VIRTUAL_ADDRESSING] = "false"
            props[S3_CONNECT_TIMEOUT] = f"{self.s3.connect_timeout:g}"
            props[S3_REQUEST_TIMEOUT] = f"{self.s3.request_timeout:g}"
        return props

    def java_properties(self) -> dict[str, str]:
        """Iceberg (Java) catalog properties for the same warehouse, e.g. for Spark: S3FileIO
        (needs the iceberg-aws-bundle jar) with the same endpoint, region and path style."""
        if self.s3 is None:
            return {}
        props = {"io-impl": JAVA_S3_FILE_IO}
        if self.s3.endpoint:
            props["s3.endpoint"] = self.s3.endpoint
        if self.s3.path_style:
            props["s3.path-style-access"] = "true"
        if self.s3.region:
            props["client.region"] = self.s3.region
        return props


def parse_warehouse(url: str, environ: Mapping[str, str] | None = None) -> Warehouse:
    """The warehouse for `url`. Without `region=` an S3 warehouse takes AWS_REGION /
    AWS_DEFAULT_REGION, and with an `endpoint` but no region at all `us-east-1` (S3-compatible
    stores ignore it; without one pyiceberg would ask AWS where the bucket lives).
    Raises ValueError for an unknown scheme or parameter."""
    environ = os.environ if environ is None else environ
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        from s3stream.s3 import S3Settings  # the --object-store parser

        s = S3Settings.from_url(url)
        region = s.region or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        if region is None and s.endpoint:
            region = "us-east-1"
        location = f"s3://{s.bucket}/{s.prefix}".rstrip("/")
        access = S3Access(s.endpoint, region, s.path_style, s.connect_timeout, s.read_timeout)
        return Warehouse(location, access)
    if parts.query:
        raise ValueError(f"warehouse {url!r}: query parameters are understood on s3:// URLs only")
    if scheme == "":
        return Warehouse(Path(url).resolve().as_uri(), None)  # a plain local path
    if scheme in ("file", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "hdfs"):
        return Warehouse(url.rstrip("/"), None)
    raise ValueError(f"unsupported warehouse URL {url!r} (file:///DIR or s3://BUCKET/PREFIX?...)")
