from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess, running_broker
from tests.ci_skips import (  # noqa: F401  (hooks: in CI a skip is a failure)
    pytest_configure,
    pytest_make_collect_report,
    pytest_runtest_makereport,
)
from tests.kafkapython import close_refused_sockets
from tests.nullctx import ctx  # noqa: F401  (a BrokerContext on the null engine)
from tests.pg import metadata_url, pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)
from tests.s3server import broker_on_s3, moto_s3
from tests.warehouses import warehouse  # noqa: F401  (Iceberg warehouse fixture)

close_refused_sockets()  # kafka-python 3.0 leaks a socket per refused connection: see there


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """One moto S3 server (the real S3 HTTP API) for the whole session; tests use own buckets."""
    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture(params=["file", "s3"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh single-node broker process on 127.0.0.1 with its own data directory, once with
    the local object store and once on S3 (moto's server): every broker behaviour test runs
    against both backends."""
    args: list[str] = []
    env: dict[str, str] = {}
    if request.param == "s3":
        args, env = broker_on_s3(request.getfixturevalue("s3_server"))
    with running_broker(tmp_path / "floe-data", *args, **env) as b:
        yield b


def kcat_binary() -> str | None:
    return shutil.which("kcat") or shutil.which("kafkacat")
