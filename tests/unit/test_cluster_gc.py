"""Compaction and object GC with two brokers on one metadata database and one object store
(file and S3 on moto): a broker compacts only the partitions it leads, and an object is
deleted only when no chunk in the metadata references it, so the other broker, which still
reads some of the same WAL objects, never loses a byte."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import boto3
import pytest

from broker.cluster import ClusterSettings
from broker.protocol import records
from broker.protocol.recordcodec import decode_records
from broker.storage import Storage
from s3stream.compaction import CompactionSettings, Compactor
from s3stream.log import WalSettings
from s3stream.metadata import open_metadata_store
from s3stream.objectstore import open_object_store
from tests.rawclient import make_batch
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV, moto_s3

BUCKET = "floe-cluster-gc"
NOW = CompactionSettings(min_age_ms=0, gc_delay_ms=0)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in TEST_AWS_ENV.items():
            mp.setenv(k, v)
        for k in UNSET_AWS_ENV:
            mp.delenv(k, raising=False)
        with moto_s3() as endpoint:
            c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            c.create_bucket(Bucket=BUCKET)
            c.close()
            yield endpoint


@pytest.fixture(params=["file", "s3"])
def objects_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "objects").as_uri()
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint={endpoint}&region=us-east-1"


@pytest.fixture
async def brokers(objects_url: str, tmp_path: Path) -> AsyncIterator[list[Storage]]:
    """Brokers 1 and 2; heartbeats only when the test makes them."""
    out: list[Storage] = []
    for n in (1, 2):
        s = Storage(open_object_store(objects_url),
                    open_metadata_store(f"sqlite:///{tmp_path / 'meta.db'}"),
                    WalSettings(flush_interval_ms=1),
                    ClusterSettings(node_id=n, heartbeat_interval_ms=600_000,
                                    session_timeout_ms=600_000))
        await s.open()
        out.append(s)
    yield out
    for s in out:
        await s.close()


async def values(s: Storage, partition: int) -> list[bytes]:
    got: list[bytes] = []
    end = s.offsets("t", partition)[1]
    offset = 0
    while offset < end:
        data = await s.read("t", partition, offset, 1 << 20, True)
        for h in records.iter_headers(data):
            got += [r.value or b"" for r in decode_records(data, h)]
            offset = h.next_offset
    return got


async def test_each_broker_compacts_its_own_and_gc_spares_the_others_objects(
    brokers: list[Storage],
) -> None:
    a, b = brokers
    await a.advertise("127.0.0.1", 1)
    await a.create_topic("t", 2, {})  # broker 2 has no address yet: broker 1 leads both
    want: dict[int, list[bytes]] = {0: [], 1: []}
    for i in range(5):  # both partitions in every WAL object
        futures = []
        for p in (0, 1):
            want[p].append(f"{p}-{i}".encode())
            futures.append(a.append("t", p, make_batch([want[p][-1]])))
        for f in futures:
            await f
    wal = await a.meta.objects("wal")
    assert len(wal) == 5
    await b.advertise("127.0.0.1", 2)
    await a._sync()  # the controller (broker 1) hands partition 1 to broker 2
    await b._sync()
    assert (set(a.cluster.held), set(b.cluster.held)) == ({a.stream_id("t", 0)},
                                                          {b.stream_id("t", 1)})

    stats = await Compactor(a.log, NOW).run_once()
    assert (stats.stream_objects, stats.deleted_objects) == (1, 0)  # p1 still in the WAL
    assert await a.objects.list("wal/") == [o.key for o in wal]
    assert await values(a, 0) == want[0] and await values(b, 1) == want[1]

    stats = await Compactor(b.log, NOW).run_once()
    assert (stats.stream_objects, stats.deleted_objects) == (1, 5)  # now nobody's
    assert await b.objects.list("wal/") == []
    assert await Compactor(a.log, NOW).run_once() == type(stats)()  # nothing left to do
    assert await values(a, 0) == want[0] and await values(b, 1) == want[1]
