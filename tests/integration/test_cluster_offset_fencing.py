"""Offset commits fenced by the group's coordinator epoch, with real `floe broker` processes
(issue 12; broker/cluster/groupguard.py). Broker 1 heartbeats only once a minute, so after
broker 2 joins, broker 1's view still says it coordinates the group (the window the fence
closes: before it, such a commit landed where the new coordinator did not look). Broker 2
takes the group over (an OffsetFetch) and commits; an OffsetFetch then sent to broker 1 is
refused with NOT_COORDINATOR rather than answered with broker 1's older offsets, and a commit
is refused and writes nothing, although broker 1 still names itself in FindCoordinator; its
later requests for the group are refused too; the committed offsets never go back."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from kio.schema.find_coordinator.v4 import request as find_v4
from kio.schema.offset_commit.v8 import request as commit_v8
from kio.schema.offset_fetch.v7 import request as fetch_v7
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32, i64

from broker.cluster.coordinators import slot_of, slot_owner
from tests.brokerproc import running_broker
from tests.integration.test_cluster import create_topic, wait_for
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)
from tests.rawclient import RawClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NOT_COORDINATOR = 16
GROUP = next(g for g in (f"fenced-{i}" for i in range(1000))
             if slot_owner(slot_of(g), [1, 2]) == 2)  # broker 1's alone, broker 2's once it joins


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{(tmp_path / 'meta.db').resolve()}"
    return str(request.getfixturevalue("pg_url"))


def commit(address: str, offset: int) -> int:
    """A simple (generation -1) OffsetCommit of f-0 for GROUP: the partition's error code."""
    req = commit_v8.OffsetCommitRequest(
        group_id=GroupId(GROUP), generation_id_or_member_epoch=i32(-1), member_id="",
        group_instance_id=None, topics=(commit_v8.OffsetCommitRequestTopic(
            name=TopicName("f"), partitions=(commit_v8.OffsetCommitRequestPartition(
                partition_index=i32(0), committed_offset=i64(offset),
                committed_leader_epoch=i32(-1), committed_metadata=None),)),))
    with RawClient(address) as c:
        resp: Any = c.request(req)
    return int(resp.topics[0].partitions[0].error_code.value)


def fetch(address: str) -> tuple[int, int]:
    """(error code, committed offset of f-0) from an OffsetFetch for GROUP."""
    req = fetch_v7.OffsetFetchRequest(
        group_id=GroupId(GROUP), topics=(fetch_v7.OffsetFetchRequestTopic(
            name=TopicName("f"), partition_indexes=(i32(0),)),), require_stable=False)
    with RawClient(address) as c:
        resp: Any = c.request(req)
    if resp.error_code.value:
        return int(resp.error_code.value), -1
    return 0, int(resp.topics[0].partitions[0].committed_offset)


def coordinator(address: str) -> int:
    """The node id FindCoordinator on this broker names for GROUP."""
    req = find_v4.FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(GROUP,))
    with RawClient(address) as c:
        resp: Any = c.request(req)
    return int(resp.coordinators[0].node_id)


def test_a_commit_to_the_old_coordinator_after_a_take_over_is_refused(
    tmp_path: Path, metadata: str
) -> None:
    shared = ["--object-store", (tmp_path / "objects").resolve().as_uri(), "--metadata", metadata]
    slow = ["--set", "broker.heartbeat.interval.ms=60000", "--set",
            "broker.session.timeout.ms=240000"]
    with contextlib.ExitStack() as stack:
        one = stack.enter_context(running_broker(tmp_path / "b1", "--node-id", "1", *shared,
                                                 *slow))
        create_topic(one.bootstrap, "f", 1)
        assert coordinator(one.bootstrap) == 1
        assert commit(one.bootstrap, 10) == 0

        two = stack.enter_context(running_broker(tmp_path / "b2", "--node-id", "2", *shared))
        wait_for("broker 2 to know the topic and place the group on itself",
                 lambda: coordinator(two.bootstrap) == 2 and fetch(two.bootstrap) == (0, 10),
                 timeout=15)  # broker 2 took the group over: it read 10
        assert coordinator(one.bootstrap) == 1  # broker 1 has not seen broker 2 yet
        assert commit(two.bootstrap, 15) == 0
        # an OffsetFetch on broker 1 is refused, not answered from its view (10, stale)
        assert fetch(one.bootstrap) == (NOT_COORDINATOR, -1)
        assert coordinator(one.bootstrap) == 1  # (still stale)

        assert commit(one.bootstrap, 20) == NOT_COORDINATOR  # the fence, not broker 1's view
        assert coordinator(one.bootstrap) == 1  # (still stale)
        assert fetch(two.bootstrap) == (0, 15)  # nothing written
        # broker 1 tries to take the group back at its next request: the database says no
        assert commit(one.bootstrap, 21) == NOT_COORDINATOR
        assert fetch(one.bootstrap) == (NOT_COORDINATOR, -1)
        assert commit(two.bootstrap, 30) == 0
        assert fetch(two.bootstrap) == (0, 30)
        assert "Traceback" not in one.log() + two.log()
