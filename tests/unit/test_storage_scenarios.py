"""Storage scenarios, written once against `broker.engine.StorageEngine` and run over every
engine the object-store URL selects (`broker.app.build_storage`, the composition root's
factory): the s3stream engine on `memory://`, `file://` and `s3://` (moto's S3 server) objects.
The null engine (`null://`), which stores no record, has its own contract below.

Each scenario drives only the Protocol's methods: what a handler, DeleteRecords, retention or a
table writer may do. Restart persistence is checked where the engine persists (file, s3)."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.app import build_storage
from broker.config import Settings, load_settings, topic_defaults
from broker.engine import AppendResult, StorageEngine
from broker.errors import ErrorCode, KafkaError
from broker.nullstorage import NullStorage
from broker.protocol import records
from broker.protocol.recordcodec import decode_records
from tests.rawclient import make_batch
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV, broker_on_s3

OLD_TS = 1_700_000_000_000  # make_batch's default base timestamp (November 2023)


@pytest.fixture(params=["memory", "file", "s3"])
def settings(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """Broker settings naming one engine; the metadata store is SQLite in tmp_path."""
    yield engine_settings(request, tmp_path, monkeypatch)


@pytest.fixture(params=["file", "s3"])
def durable_settings(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """The engines whose objects outlive the process (memory:// has nothing to restart)."""
    yield engine_settings(request, tmp_path, monkeypatch)


def engine_settings(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "file":
        url = (tmp_path / "objects").as_uri()
    else:
        args, _env = broker_on_s3(request.getfixturevalue("s3_server"), "scenarios")
        url = args[1]
        for k, v in TEST_AWS_ENV.items():
            monkeypatch.setenv(k, v)
        for k in UNSET_AWS_ENV:
            monkeypatch.delenv(k, raising=False)
    flags: dict[str, str | None] = {
        "data.dir": str(tmp_path / "data"),
        "object.store": url,
        "wal.flush.interval.ms": "1",
    }
    return load_settings(flags, None, environ={})


async def open_engine(settings: Settings) -> StorageEngine:
    engine = build_storage(settings)
    engine.topic_defaults.update(topic_defaults(settings))
    await engine.open()
    return engine


@pytest.fixture
async def engine(settings: Settings) -> AsyncIterator[StorageEngine]:
    e = await open_engine(settings)
    yield e
    await e.close()


async def append(
    e: StorageEngine, topic: str, partition: int, data: bytes | bytearray
) -> AppendResult:
    return await asyncio.wait_for(e.append(topic, partition, bytes(data)), 10)


async def values_from(e: StorageEngine, topic: str, partition: int, offset: int) -> list[
    tuple[int, bytes | None]
]:
    """(offset, value) of every record from `offset` to the high watermark."""
    out: list[tuple[int, bytes | None]] = []
    _start, end = e.offsets(topic, partition)
    while offset < end:
        data = await e.read(topic, partition, offset, 1 << 20, True)
        assert data, f"no batch at {offset} below the high watermark {end}"
        for h in records.iter_headers(data):
            out += [(r.offset, r.value) for r in decode_records(data, h) if r.offset >= offset]
            offset = h.next_offset
    return out


def code_of(exc: pytest.ExceptionInfo[KafkaError]) -> ErrorCode:
    return exc.value.code


# -- topics --------------------------------------------------------------------------------
async def test_topics_are_created_listed_grown_and_deleted(engine: StorageEngine) -> None:
    t = await engine.create_topic("orders", 3, {"retention.ms": "60000"})
    assert engine.topics["orders"] is t and engine.topics_by_id[t.topic_id] is t
    assert t.partitions == 3 and engine.offsets("orders", 2) == (0, 0)
    assert t.config.retention_ms == 60000
    with pytest.raises(KafkaError) as e:
        await engine.create_topic("orders", 1, {})
    assert code_of(e) == ErrorCode.topic_already_exists
    with pytest.raises(KafkaError) as e:
        await engine.create_topic("bad/name", 1, {})
    assert code_of(e) == ErrorCode.invalid_topic_exception
    with pytest.raises(KafkaError) as e:
        await engine.create_topic("x", 1, {"no.such.config": "1"})
    assert code_of(e) == ErrorCode.invalid_config
    await engine.create_partitions("orders", 5, validate_only=False)
    assert engine.topic("orders").partitions == 5 and engine.offsets("orders", 4) == (0, 0)
    with pytest.raises(KafkaError) as e:
        await engine.create_partitions("orders", 5, validate_only=False)
    assert code_of(e) == ErrorCode.invalid_partitions
    await engine.delete_topic("orders")
    assert "orders" not in engine.topics
    with pytest.raises(KafkaError) as e:
        engine.offsets("orders", 0)
    assert code_of(e) == ErrorCode.unknown_topic_or_partition


async def test_configs_are_validated_replaced_and_applied(engine: StorageEngine) -> None:
    await engine.create_topic("c", 1, {})
    assert (await append(engine, "c", 0, make_batch([b"a"]))).log_append_time == -1
    with pytest.raises(KafkaError) as e:
        await engine.set_topic_configs("c", {"retention.ms": "soon"}, validate_only=False)
    assert code_of(e) == ErrorCode.invalid_config
    await engine.set_topic_configs("c", {"message.timestamp.type": "LogAppendTime"}, True)
    assert engine.topic("c").configs == {}  # validate_only changes nothing
    await engine.set_topic_configs("c", {"message.timestamp.type": "LogAppendTime"}, False)
    before = int(time.time() * 1000)
    stamped = await append(engine, "c", 0, make_batch([b"b"]))
    assert stamped.base_offset == 1 and stamped.log_append_time >= before


# -- append, read, offsets -----------------------------------------------------------------
async def test_appends_across_partitions_get_consecutive_offsets_and_read_back(
    engine: StorageEngine,
) -> None:
    await engine.create_topic("t", 3, {})
    pending = [
        engine.append("t", p, bytes(make_batch([f"p{p}-{i}-{j}".encode() for j in range(i + 1)])))
        for i in range(4)
        for p in range(3)
    ]  # appended in this order, without awaiting: offsets follow the call order
    bases = [(await asyncio.wait_for(f, 10)).base_offset for f in pending]
    assert bases == [b for b in (0, 1, 3, 6) for _ in range(3)]
    for p in range(3):
        assert engine.offsets("t", p) == (0, 10)
        got = await values_from(engine, "t", p, 0)
        assert got == [
            (o, f"p{p}-{i}-{j}".encode())
            for o, (i, j) in enumerate((i, j) for i in range(4) for j in range(i + 1))
        ]
        assert [o for o, _ in await values_from(engine, "t", p, 4)] == list(range(4, 10))
    assert await engine.read("t", 0, 10, 1 << 20, True) == b""  # at the high watermark
    with pytest.raises(KafkaError) as e:
        await engine.read("t", 0, 11, 1 << 20, True)
    assert code_of(e) == ErrorCode.offset_out_of_range
    with pytest.raises(KafkaError) as e:
        engine.append("t", 3, bytes(make_batch([b"x"])))
    assert code_of(e) == ErrorCode.unknown_topic_or_partition


async def test_record_sets_in_a_request_frame_are_stored_without_a_copy(
    engine: StorageEngine,
) -> None:
    """What the network layer hands over (broker/protocol/producerequest.py): record sets as
    writable views into the request's frame. The offsets are written into the frame itself,
    what is stored reads back right, and once durable nothing the engine keeps (WAL, cache)
    still points into the frame (it could be resized: no buffer exported). A read-only view
    (a frame some other code owns) is left as it was."""
    await engine.create_topic("v", 2, {})
    batches = [make_batch([f"r{i}-{j}".encode() for j in range(i + 1)]) for i in range(4)]
    frame = bytearray(b"head")
    spans = []
    for b in batches:
        spans.append((len(frame), len(frame) + len(b)))
        frame += b + b"gap"
    view = memoryview(frame)
    pending = [engine.append("v", i % 2, view[a:z]) for i, (a, z) in enumerate(spans)]
    bases = [(await asyncio.wait_for(f, 10)).base_offset for f in pending]
    assert bases == [0, 0, 1, 2]  # partition 0: 1 then 3 records; 1: 2 then 4
    for base, (a, _z) in zip(bases, spans, strict=True):
        assert struct.unpack_from(">q", frame, a)[0] == base  # written in place
    del view, pending
    frame += b"resized"  # BufferError if the engine still held a view into it
    assert [v for _, v in await values_from(engine, "v", 0, 0)] == [
        b"r0-0", b"r2-0", b"r2-1", b"r2-2"]
    assert [o for o, _ in await values_from(engine, "v", 1, 0)] == list(range(6))
    other = bytearray(make_batch([b"x"]))
    kept = bytes(other)
    assert (await append_view(engine, "v", 0, memoryview(other).toreadonly())).base_offset == 4
    assert other == kept
    assert [v for _, v in await values_from(engine, "v", 0, 4)] == [b"x"]


async def append_view(
    e: StorageEngine, topic: str, partition: int, data: memoryview
) -> AppendResult:
    return await asyncio.wait_for(e.append(topic, partition, data), 10)


async def test_offset_for_time_finds_the_first_record_at_or_after(engine: StorageEngine) -> None:
    await engine.create_topic("ts", 1, {})
    await append(engine, "ts", 0, make_batch([b"a", b"b", b"c"], base_ts_ms=OLD_TS))
    await append(engine, "ts", 0, make_batch([b"d"], base_ts_ms=OLD_TS + 10_000))
    assert await engine.offset_for_time("ts", 0, OLD_TS + 1000) == (1, OLD_TS + 1000)
    assert await engine.offset_for_time("ts", 0, OLD_TS + 2500) == (3, OLD_TS + 10_000)
    assert await engine.offset_for_time("ts", 0, -3) == (3, OLD_TS + 10_000)
    assert await engine.offset_for_time("ts", 0, OLD_TS + 20_000) is None


# -- idempotent producers ------------------------------------------------------------------
async def test_idempotent_duplicates_are_acknowledged_once_and_gaps_refused(
    engine: StorageEngine,
) -> None:
    await engine.create_topic("idem", 1, {})
    pid, epoch = await engine.init_producer_id(-1, -1)
    assert epoch == 0

    def batch(seq: int, n: int) -> bytes:
        vals = [f"s{seq + i}".encode() for i in range(n)]
        return bytes(make_batch(vals, producer_id=pid, producer_epoch=0, base_sequence=seq))

    assert (await append(engine, "idem", 0, batch(0, 2))).base_offset == 0
    assert (await append(engine, "idem", 0, batch(2, 1))).base_offset == 2
    assert (await append(engine, "idem", 0, batch(0, 2))).base_offset == 0  # a retry
    assert engine.offsets("idem", 0) == (0, 3)
    with pytest.raises(KafkaError) as e:
        engine.append("idem", 0, batch(5, 1))  # sequence 3 expected
    assert code_of(e) == ErrorCode.out_of_order_sequence_number
    assert await engine.init_producer_id(pid, 0) == (pid, 1)
    assert [v for _, v in await values_from(engine, "idem", 0, 0)] == [b"s0", b"s1", b"s2"]


# -- log start: DeleteRecords and retention ------------------------------------------------
async def test_delete_records_moves_the_log_start(engine: StorageEngine) -> None:
    await engine.create_topic("d", 2, {})
    for _ in range(3):
        await append(engine, "d", 0, make_batch([b"x", b"y"]))
    assert await engine.delete_records("d", 0, 2) == 2
    assert engine.offsets("d", 0) == (2, 6)
    with pytest.raises(KafkaError) as e:
        await engine.read("d", 0, 1, 1 << 20, True)
    assert code_of(e) == ErrorCode.offset_out_of_range
    assert [o for o, _ in await values_from(engine, "d", 0, 2)] == [2, 3, 4, 5]
    assert await engine.delete_records("d", 0, 1) == 2  # never backwards
    with pytest.raises(KafkaError) as e:
        await engine.delete_records("d", 0, 7)
    assert code_of(e) == ErrorCode.offset_out_of_range
    assert await engine.delete_records("d", 0, -1) == 6  # -1: the high watermark
    assert engine.offsets("d", 0) == (6, 6) and engine.offsets("d", 1) == (0, 0)


async def test_retention_moves_the_log_start_of_delete_topics_only(engine: StorageEngine) -> None:
    await engine.create_topic("old", 1, {"retention.ms": "60000"})
    await engine.create_topic("kept", 1, {"retention.ms": "-1"})
    await engine.create_topic("compacted", 1, {"cleanup.policy": "compact", "retention.ms": "1"})
    for name in ("old", "kept", "compacted"):
        await append(engine, name, 0, make_batch([b"a", b"b"], base_ts_ms=OLD_TS))
    assert await engine.apply_retention() == 1
    assert engine.offsets("old", 0) == (2, 2)
    assert engine.offsets("kept", 0) == (0, 2) and engine.offsets("compacted", 0) == (0, 2)
    assert await engine.apply_retention() == 0


# -- restart -------------------------------------------------------------------------------
async def test_everything_acknowledged_survives_a_restart(durable_settings: Settings) -> None:
    settings = durable_settings
    e = await open_engine(settings)
    try:
        await e.create_topic("r", 2, {"retention.ms": "86400000"})
        pid, _ = await e.init_producer_id(-1, -1)
        first = make_batch([b"a", b"b"], producer_id=pid, producer_epoch=0, base_sequence=0)
        await append(e, "r", 0, first)
        await append(e, "r", 1, make_batch([b"c"]))
        await append(e, "r", 1, make_batch([b"d"]))
        await e.delete_records("r", 1, 1)
        topic_id = e.topic("r").topic_id
    finally:
        await e.close()
    e = await open_engine(settings)
    try:
        t = e.topic("r")
        assert t.topic_id == topic_id and t.config.retention_ms == 86400000
        assert e.offsets("r", 0) == (0, 2) and e.offsets("r", 1) == (1, 2)
        assert await values_from(e, "r", 0, 0) == [(0, b"a"), (1, b"b")]
        assert await values_from(e, "r", 1, 1) == [(1, b"d")]
        assert (await append(e, "r", 0, first)).base_offset == 0  # still a known duplicate
        assert e.offsets("r", 0) == (0, 2)
        assert (await e.init_producer_id(-1, -1))[0] != pid
    finally:
        await e.close()


# -- the null engine -----------------------------------------------------------------------
def null_settings(tmp_path: Path) -> Settings:
    flags: dict[str, str | None] = {"data.dir": str(tmp_path), "object.store": "null://"}
    return load_settings(flags, None, environ={})


async def test_null_engine_acknowledges_counts_offsets_and_stores_nothing(tmp_path: Path) -> None:
    e: StorageEngine = NullStorage()
    await e.open()
    await e.create_topic("n", 2, {})
    f = e.append("n", 1, bytes(make_batch([b"a", b"b", b"c"])))
    assert f.done() and f.result().base_offset == 0  # acknowledged at once
    assert (await e.append("n", 1, bytes(make_batch([b"d"])))).base_offset == 3
    assert e.offsets("n", 1) == (0, 4) and e.offsets("n", 0) == (0, 0)
    assert await e.read("n", 1, 0, 1 << 20, True) == b""  # no record bytes kept
    with pytest.raises(KafkaError) as exc:
        await e.read("n", 1, 5, 1 << 20, True)
    assert code_of(exc) == ErrorCode.offset_out_of_range
    with pytest.raises(KafkaError) as exc:
        e.append("n", 2, bytes(make_batch([b"x"])))
    assert code_of(exc) == ErrorCode.unknown_topic_or_partition
    with pytest.raises(KafkaError) as exc:
        e.append("n", 0, b"\x00" * 10)
    assert code_of(exc) == ErrorCode.corrupt_message
    assert await e.delete_records("n", 1, 2) == 2 and e.offsets("n", 1) == (2, 4)
    assert await e.offset_for_time("n", 1, 0) is None
    assert e.maintenance_jobs(null_settings(tmp_path)) == []
    await e.close()
