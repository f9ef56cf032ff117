"""Offset commits fenced by the group's coordinator epoch (broker.cluster.groupguard), on
SQLite and PostgreSQL: two in-process brokers (ClusterNode + OffsetStore each, own
connection) on one metadata database. A broker joining takes a group over; a commit the old
coordinator sends afterwards is refused with NOT_COORDINATOR and writes nothing; everything
the old coordinator had committed is what the new one reads; the offsets never go back."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.cluster import ClusterNode, ClusterSettings
from broker.cluster.coordinators import slot_of, slot_owner
from broker.cluster.groupguard import FencedGroupOffsets
from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import OffsetStore
from broker.metadata import KafkaMetadata
from s3stream.metadata import open_metadata_store
from tests.pg import pg_cluster, pg_url  # noqa: F401  (PostgreSQL fixtures)

# a group placed on broker 2 once brokers 1 and 2 are live (on 1 while 1 is alone)
GROUP = next(g for g in (f"g{i}" for i in range(1000))
             if slot_owner(slot_of(g), [1, 2]) == 2)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return (f"sqlite:///{tmp_path / 'meta.db'}" if request.param == "sqlite"
            else str(request.getfixturevalue("pg_url")))


class Broker:
    def __init__(self, url: str, node_id: int) -> None:
        self.kafka = KafkaMetadata(open_metadata_store(url))
        self.node = ClusterNode(self.kafka.store, ClusterSettings(node_id=node_id))
        self.offsets = OffsetStore(FencedGroupOffsets(self.kafka, self.node))

    async def start(self) -> Broker:
        await self.kafka.open()
        await self.node.register()
        await self.node.advertise("127.0.0.1", 9000 + self.node.node_id)
        await self.node.heartbeat()
        return self

    async def commit(self, offset: int) -> None:
        await self.offsets.commit(GROUP, [("t", 0, offset, 0, None)])

    async def stop(self) -> None:
        await self.node.stop()
        await self.kafka.close()


@pytest.fixture
async def brokers(url: str) -> AsyncIterator[list[Broker]]:
    made: list[Broker] = []
    yield made
    for b in made:
        await b.stop()


async def stored(b: Broker) -> int:
    rows = [r for r in await b.kafka.load_offsets() if r.group_id == GROUP]
    assert len(rows) == 1
    return rows[0].committed_offset


def refused(e: pytest.ExceptionInfo[KafkaError]) -> bool:
    return e.value.code == ErrorCode.not_coordinator


async def test_a_joining_broker_takes_the_group_and_the_old_coordinators_commits_are_refused(
    url: str, brokers: list[Broker],
) -> None:
    a = await Broker(url, 1).start()
    brokers.append(a)
    await a.offsets.reload(GROUP)  # a alone: the group is a's
    await a.commit(10)

    b = await Broker(url, 2).start()
    brokers.append(b)
    await a.commit(20)  # b has not taken the group yet: a's commit still lands...
    await b.offsets.reload(GROUP)  # ...and is what b reads when it takes the group over
    row = b.offsets.get(GROUP, "t", 0)
    assert row is not None and row.committed_offset == 20

    # OffsetFetch: b answers; a, whose view still places the group on itself, must not
    # answer from its offsets (they stop at a's last commit): the database says b took it
    assert await b.offsets.still_held(GROUP)
    assert not await a.offsets.still_held(GROUP) and GROUP in a.offsets.lost

    with pytest.raises(KafkaError) as e:  # a, still alive, sent a commit after the move
        await a.commit(30)
    assert refused(e) and await stored(a) == 20  # refused, nothing written
    assert GROUP in a.offsets.lost  # to be unloaded by a at the group's next request
    with pytest.raises(KafkaError) as e:  # OffsetDelete / DeleteGroups: fenced the same way
        await a.offsets.delete(GROUP, None)
    assert refused(e) and await stored(a) == 20
    with pytest.raises(KafkaError) as e:  # a cannot take it back: the database places it on b
        await a.offsets.reload(GROUP)
    assert refused(e)
    await b.commit(40)
    assert await stored(b) == 40

    # b leaves: the group comes back to a, which reads b's commits; b's are refused now
    await b.node.stop()
    await a.offsets.reload(GROUP)
    row = a.offsets.get(GROUP, "t", 0)
    assert row is not None and row.committed_offset == 40 and GROUP not in a.offsets.lost
    assert await a.offsets.still_held(GROUP) and not await b.offsets.still_held(GROUP)
    await a.commit(50)
    with pytest.raises(KafkaError) as e:
        await b.commit(60)
    assert refused(e) and await stored(a) == 50
    await a.offsets.delete(GROUP, [("t", 0)])  # the coordinator's own delete lands
    assert [r for r in await a.kafka.load_offsets() if r.group_id == GROUP] == []


async def test_commits_racing_a_take_over_are_either_read_by_it_or_refused(
    url: str, brokers: list[Broker],
) -> None:
    """The old coordinator commits 1, 2, 3, ... as fast as it can while the new one takes the
    group over: the offset the new one reads is the last commit acknowledged to the old one,
    and every commit after it is refused (none acknowledged and lost)."""
    a = await Broker(url, 1).start()
    brokers.append(a)
    await a.offsets.reload(GROUP)
    b = await Broker(url, 2).start()
    brokers.append(b)
    acked: list[int] = []
    refusals: list[int] = []

    async def old_coordinator() -> None:
        for i in itertools.count(1):  # until refused: the take-over's time varies by machine
            try:
                await a.commit(i)
                assert not refusals, "a commit acknowledged after a refusal"
                acked.append(i)
            except KafkaError as e:
                assert e.code == ErrorCode.not_coordinator
                refusals.append(i)
                if len(refusals) >= 5:
                    return

    async def new_coordinator() -> None:
        while len(acked) < 20:
            await asyncio.sleep(0.005)
        await b.offsets.reload(GROUP)

    await asyncio.wait_for(asyncio.gather(old_coordinator(), new_coordinator()), 60)
    row = b.offsets.get(GROUP, "t", 0)
    assert refusals and acked and row is not None
    assert row.committed_offset == acked[-1]
    assert await stored(b) == acked[-1]
