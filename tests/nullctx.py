"""`ctx`: a BrokerContext on the null engine (one topic "t" of one partition), for tests that
drive handlers or the network layer in-process (registered in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import load_settings
from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import OffsetStore
from broker.handlers import BrokerContext
from broker.nullstorage import NullStorage


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[BrokerContext]:
    settings = load_settings({"data.dir": str(tmp_path)}, None, environ={})
    storage = NullStorage()
    await storage.open()
    await storage.create_topic("t", 1, {})
    groups = GroupCoordinator(initial_delay_s=0.0)
    groups.start()
    yield BrokerContext(storage, settings, 0, "127.0.0.1", 9092, groups, OffsetStore(
        storage.group_offsets
    ))
    await groups.stop()
    await storage.close()
