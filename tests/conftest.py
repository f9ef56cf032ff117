from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess, running_broker
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh single-node broker process on 127.0.0.1 with its own data directory."""
    with running_broker(tmp_path / "floe-data") as b:
        yield b


def kcat_binary() -> str | None:
    return shutil.which("kcat") or shutil.which("kafkacat")
