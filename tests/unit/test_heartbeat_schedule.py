"""The cluster heartbeat's cadence (broker.cluster.node): heartbeats start one interval apart
however long each one's sync takes (a take-over loading partitions must not push the next
lease renewal past the session timeout), and a renewal that comes late is logged with where
the time went. A real SQLite metadata store; the sync is the broker's shape: a heartbeat, then
slow work."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path

import pytest

from broker.cluster import ClusterNode, ClusterSettings
from broker.metadata import KafkaMetadata
from s3stream.metadata import open_metadata_store


async def run_node(tmp_path: Path, settings: ClusterSettings, work_s: float,
                   run_s: float) -> list[float]:
    """Start times of the heartbeats of a node whose sync works `work_s` after each one."""
    kafka = KafkaMetadata(open_metadata_store(f"sqlite:///{tmp_path / 'meta.db'}"))
    await kafka.open()
    node = ClusterNode(kafka.store, settings)
    await node.register()
    starts: list[float] = []

    async def sync() -> None:
        starts.append(time.monotonic())
        await node.heartbeat()
        await asyncio.sleep(work_s)

    node.start(sync)
    try:
        await asyncio.sleep(run_s)
        assert node.lease_valid()
    finally:
        await node.stop()
        await kafka.close()
    return starts


async def test_heartbeats_start_an_interval_apart_whatever_the_sync_takes(
    tmp_path: Path
) -> None:
    # before: the interval was slept after each sync, so starts came 0.6 s apart
    starts = await run_node(tmp_path, ClusterSettings(node_id=1, heartbeat_interval_ms=300),
                            work_s=0.3, run_s=2.0)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) >= 4, starts
    assert max(gaps) < 0.5, gaps


async def test_a_late_renewal_is_logged_with_where_its_time_went(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker.cluster.node")
    # sync work of 0.45 s with a 0.6 s session: renewals 0.45 s apart, past half the session
    await run_node(tmp_path, ClusterSettings(node_id=1, heartbeat_interval_ms=100,
                                             session_timeout_ms=600), work_s=0.45, run_s=1.5)
    late = [r.getMessage() for r in caplog.records if "lease renewed" in r.getMessage()]
    assert late, caplog.text
    assert "queued" in late[0] and "transaction" in late[0]


async def test_renewals_on_time_are_not_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker.cluster.node")
    await run_node(tmp_path, ClusterSettings(node_id=1, heartbeat_interval_ms=100),
                   work_s=0.0, run_s=1.0)
    assert "lease renewed" not in caplog.text
