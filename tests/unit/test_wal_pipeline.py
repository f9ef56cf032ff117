"""Pipelined WAL flushes (`wal.max.inflight.flushes`), on memory://, file:// and s3:// (moto).

What must hold: several WAL objects upload at once, but their metadata commits happen in the
order they were cut, so an ack never overtakes an earlier flush; when an upload fails, every
later append of its streams (in flushes already uploading, or pending) fails too and the
stream rewinds, so a retry gets the same offsets (no gap, no reuse), while other streams'
appends in those later flushes still commit; close waits for every flush in flight. Flushes
already uploaded when an earlier one reaches its commit turn commit in its transaction (group
commit), all or none: when that is refused, each commits (or fails) on its own. Memory
is bounded: a flush takes at most `flush.max.bytes` of what is pending, and `room()` holds
producers back while more than the limit is appended and not yet committed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest

from broker.config import ConfigError, load_settings
from s3stream.log import LogStore, StreamFencedError, StreamWriteError, WalSettings
from s3stream.metadata import (
    ChunkRow,
    CommitAttachment,
    ObjectCommit,
    SqliteMetadataStore,
    StreamsFencedError,
)
from s3stream.metadata.backend import Connection
from s3stream.objectstore import Buffer, ObjectStore, open_object_store, put_parts
from tests.faults import PassThrough
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV, broker_on_s3

WAIT = 5.0  # seconds any awaited step may take


class Gated(PassThrough):
    """An object store whose WAL puts (numbered from 0 in the order they start) can be held
    until released, and made to fail; it records when each starts and ends."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.held: dict[int, asyncio.Event] = {}
        self.failing: set[int] = set()
        self.events: list[str] = []  # "start 0", "end 0", "fail 0", ...
        self.changed = asyncio.Event()

    def hold(self, *puts: int) -> None:
        for i in puts:
            self.held[i] = asyncio.Event()

    def release(self, i: int, fail: bool = False) -> None:
        if fail:
            self.failing.add(i)
        self.held[i].set()

    async def seen(self, event: str) -> None:
        """Wait until `event` (e.g. "start 1") has happened."""

        async def wait() -> None:
            while event not in self.events:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), WAIT)

    def _note(self, event: str) -> None:
        self.events.append(event)
        self.changed.set()

    async def put_parts(self, key: str, parts: Sequence[Buffer]) -> None:
        if not key.startswith("wal/"):
            await put_parts(self.inner, key, parts)
            return
        i = sum(e.startswith("start") for e in self.events)
        self._note(f"start {i}")
        if i in self.held:
            await self.held[i].wait()
        if i in self.failing:
            self._note(f"fail {i}")
            raise OSError(f"injected: WAL put {i} failed")
        await put_parts(self.inner, key, parts)
        self._note(f"end {i}")

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self.put_parts(key, [data])


@pytest.fixture(params=["memory", "file", "s3"])
def object_store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "file":
        yield (tmp_path / "objects").as_uri()
    else:
        args, _env = broker_on_s3(request.getfixturevalue("s3_server"), "walpipe")
        for k, v in TEST_AWS_ENV.items():
            monkeypatch.setenv(k, v)
        for k in UNSET_AWS_ENV:
            monkeypatch.delenv(k, raising=False)
        yield args[1]


Env = tuple[LogStore, Gated, SqliteMetadataStore, list[int]]


@pytest.fixture
async def env(object_store_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    """A log of two streams whose WAL puts go through `Gated`, up to 4 flushes in flight."""
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(2)
    store = Gated(open_object_store(object_store_url))
    log = LogStore(store, meta, WalSettings(flush_interval_ms=1, max_inflight_flushes=4))
    await log.open(streams, [])
    yield log, store, meta, [s.stream_id for s in streams]
    for ev in store.held.values():  # never leave a flush hanging
        ev.set()
    await log.close()
    await store.close()
    await meta.close()


@pytest.fixture
async def small_env(object_store_url: str, tmp_path: Path) -> AsyncIterator[Env]:
    """As `env`, with objects of at most 100 bytes, one flush in flight: at most 200 bytes
    appended and not yet committed before `room()` waits."""
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    await meta.open()
    streams = await meta.create_streams(2)
    store = Gated(open_object_store(object_store_url))
    settings = WalSettings(flush_interval_ms=1, max_inflight_flushes=1, flush_max_bytes=100)
    log = LogStore(store, meta, settings)
    await log.open(streams, [])
    yield log, store, meta, [s.stream_id for s in streams]
    for ev in store.held.values():
        ev.set()
    await log.close()
    await store.close()
    await meta.close()


def data60(tag: str) -> Callable[[int], bytes]:
    return lambda base: f"{tag}@{base}".encode().ljust(60, b".")


def data(tag: str) -> Callable[[int], bytes]:
    return lambda base: f"{tag}@{base}".encode()


async def outcome(fut: asyncio.Future[int]) -> int | str:
    try:
        return await asyncio.wait_for(fut, WAIT)
    except StreamWriteError:
        return "failed"


async def test_uploads_overlap(env: Env) -> None:
    log, store, _meta, (a, b) = env
    store.hold(0)
    _, first = log.append(a, 1, 0, data("a1"))
    await store.seen("start 0")
    _, second = log.append(b, 1, 0, data("b1"))
    await store.seen("start 1")  # while put 0 is still held: one flush at a time never gets here
    assert "end 0" not in store.events
    store.release(0)
    assert [await outcome(first), await outcome(second)] == [0, 0]


async def test_a_later_flush_is_not_acknowledged_before_an_earlier_commit(env: Env) -> None:
    log, store, meta, (a, b) = env
    store.hold(0)
    _, first = log.append(a, 2, 0, data("a1"))
    await store.seen("start 0")
    _, second = log.append(a, 1, 0, data("a2"))
    _, other = log.append(b, 1, 0, data("b1"))  # another stream: still after flush 0
    await store.seen("end 1")  # the later object is durable ...
    await asyncio.sleep(0.05)
    assert not second.done() and not other.done(), "acknowledged before the earlier flush"
    assert log.stream(a).end_offset == 0 and log.stream(b).end_offset == 0
    streams, _chunks = await meta.load()
    assert {s.end_offset for s in streams} == {0}, "committed before the earlier flush"
    resolved: list[str] = []
    for name, fut in (("first", first), ("second", second), ("other", other)):
        fut.add_done_callback(lambda _f, name=name: resolved.append(name))
    store.release(0)
    assert [await outcome(f) for f in (first, second, other)] == [0, 2, 0]
    assert resolved == ["first", "second", "other"]
    assert [c[0] for c in await log.read(a, 0, 1 << 20)] == [0, 2]


async def test_a_failed_upload_fails_later_appends_of_its_stream_only(env: Env) -> None:
    log, store, meta, (a, b) = env
    failed_streams: list[set[int]] = []
    log.on_failed = failed_streams.append
    store.hold(0)
    _, a1 = log.append(a, 2, 0, data("a1"))  # offsets 0-1, in put 0
    await store.seen("start 0")
    _, a2 = log.append(a, 1, 0, data("a2"))  # offset 2, in put 1 (in flight)
    _, b1 = log.append(b, 1, 0, data("b1"))
    await store.seen("end 1")  # uploaded, waiting for its commit turn
    base, a3 = log.append(a, 1, 0, data("a3"))  # offset 3: pending or in put 2
    assert base == 3
    store.release(0, fail=True)
    assert [await outcome(f) for f in (a1, a2, a3)] == ["failed"] * 3
    assert await outcome(b1) == 0, "another stream's append in a later flush must commit"
    assert failed_streams and set().union(*failed_streams) == {a}
    st = log.stream(a)
    assert st.end_offset == 0 and st.next_offset == 0  # rewound to what is durable
    base, retry = log.append(a, 2, 0, data("retry"))
    assert base == 0 and await outcome(retry) == 0  # the same offsets again
    assert await log.read(a, 0, 1 << 20) == [(0, b"retry@0")]  # no gap, nothing reused
    assert await log.read(b, 0, 1 << 20) == [(0, b"b1@0")]
    streams, chunks = await meta.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 2, b: 1}
    assert sorted((c.stream_id, c.base_offset, c.last_offset) for c in chunks) == [
        (a, 0, 1),
        (b, 0, 0),
    ]


async def test_close_drains_flushes_in_flight(env: Env) -> None:
    log, store, meta, (a, b) = env
    store.hold(0, 1)
    _, first = log.append(a, 1, 0, data("a1"))
    await store.seen("start 0")
    _, second = log.append(b, 1, 0, data("b1"))
    await store.seen("start 1")
    closing = asyncio.create_task(log.close())
    await asyncio.sleep(0.05)
    assert not closing.done(), "closed with flushes in flight"
    with pytest.raises(StreamWriteError):
        log.append(a, 1, 0, data("late"))
    store.release(1)
    store.release(0)
    await asyncio.wait_for(closing, WAIT)
    assert first.result() == 0 and second.result() == 0
    streams, _chunks = await meta.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 1, b: 1}


def record_commits(meta: SqliteMetadataStore) -> list[tuple[int, str]]:
    """Note each `commit_objects` call: (objects in it, "ok" or "failed")."""
    calls: list[tuple[int, str]] = []
    inner = meta.commit_objects

    async def commit_objects(objects: Sequence[ObjectCommit]) -> list[set[int]]:
        try:
            live = await inner(objects)
        except Exception:
            calls.append((len(objects), "failed"))
            raise
        calls.append((len(objects), "ok"))
        return live

    meta.commit_objects = commit_objects  # type: ignore[method-assign]
    return calls


async def test_flushes_uploaded_while_waiting_commit_in_one_transaction(env: Env) -> None:
    log, store, meta, (a, b) = env
    calls = record_commits(meta)
    store.hold(0)
    _, a1 = log.append(a, 2, 0, data("a1"))  # offsets 0-1, put 0
    await store.seen("start 0")
    _, a2 = log.append(a, 1, 0, data("a2"))  # offset 2, put 1
    await store.seen("end 1")
    _, b1 = log.append(b, 1, 0, data("b1"))  # put 2
    _, a3 = log.append(a, 1, 0, data("a3"))
    await store.seen("end 2")
    assert calls == []
    store.release(0)
    assert [await outcome(f) for f in (a1, a2, b1, a3)] == [0, 2, 0, 3]
    assert calls == [(3, "ok")], "three objects ready at the first's turn: one transaction"
    assert (log.stats.wal_commits, log.stats.wal_flushes) == (1, 3)
    assert [c[0] for c in await log.read(a, 0, 1 << 20)] == [0, 2, 3]
    streams, chunks = await meta.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 4, b: 1}
    assert len({c.object_id for c in chunks}) == 3
    # and what commits next, alone, continues from there
    base, a4 = log.append(a, 1, 0, data("a4"))
    assert base == 4 and await outcome(a4) == 4
    assert calls[-1] == (1, "ok")


class Refuse:
    """A guard refusing any commit that includes stream `sid` (another writer took it)."""

    def __init__(self, sid: int) -> None:
        self.sid = sid

    def apply(self, db: Connection, live: set[int]) -> None:
        if self.sid in live:
            raise StreamsFencedError({self.sid}, f"stream {self.sid} taken")

    def undo(self, db: Connection, undone: list[ChunkRow]) -> None:
        pass


async def test_a_group_commit_refused_commits_each_flush_on_its_own(env: Env) -> None:
    """The later flush's guard refuses stream b: the group (both flushes) is refused, so the
    first flush commits alone; the second then commits a's append and fails b's only."""
    log, store, meta, (a, b) = env
    calls = record_commits(meta)

    def guards(sids: object) -> list[CommitAttachment]:
        return [Refuse(b)]

    log.guards = guards
    store.hold(0)
    _, a1 = log.append(a, 1, 0, data("a1"))
    await store.seen("start 0")
    _, a2 = log.append(a, 1, 0, data("a2"))
    _, b1 = log.append(b, 1, 0, data("b1"))
    await store.seen("end 1")
    store.release(0)
    assert [await outcome(f) for f in (a1, a2, b1)] == [0, 1, "failed"]
    assert calls[:2] == [(2, "failed"), (1, "ok")]
    assert [c[0] for c in await log.read(a, 0, 1 << 20)] == [0, 1]
    streams, chunks = await meta.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 2, b: 0}
    assert sorted((c.stream_id, c.base_offset) for c in chunks) == [(a, 0), (a, 1)]


async def test_a_flush_with_an_append_failed_before_is_not_grouped(env: Env) -> None:
    """Put 0 (stream a) fails, which fails a's append in put 2 too; put 1 (stream b) then
    commits alone, not with put 2, whose b append commits at its own turn."""
    log, store, meta, (a, b) = env
    calls = record_commits(meta)
    store.hold(0)
    _, a1 = log.append(a, 1, 0, data("a1"))  # put 0: fails
    await store.seen("start 0")
    _, b0 = log.append(b, 1, 0, data("b0"))  # put 1
    await store.seen("end 1")
    _, a2 = log.append(a, 1, 0, data("a2"))  # put 2: follows a failed append
    _, b1 = log.append(b, 1, 0, data("b1"))
    await store.seen("end 2")
    store.release(0, fail=True)
    assert [await outcome(f) for f in (a1, b0, a2, b1)] == ["failed", 0, "failed", 1]
    assert calls == [(1, "ok"), (1, "ok")], "no group with a failed append, none refused"
    streams, _chunks = await meta.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 0, b: 2}


async def test_a_flush_with_a_stream_dropped_meanwhile_is_not_grouped(env: Env) -> None:
    """Stream b is dropped (another broker leads it now) while its flush waits for its turn:
    that flush is not committed with the one before; at its own turn b's append fails as
    fenced and nothing of b is committed."""
    log, store, meta, (a, b) = env
    calls = record_commits(meta)
    store.hold(0)
    _, a1 = log.append(a, 1, 0, data("a1"))
    await store.seen("start 0")
    _, b1 = log.append(b, 1, 0, data("b1"))
    await store.seen("end 1")
    log.drop_stream(b)
    store.release(0)
    assert await outcome(a1) == 0
    with pytest.raises(StreamFencedError):
        await asyncio.wait_for(b1, WAIT)
    assert calls == [(1, "ok")]
    streams, chunks = await meta.load()
    assert {s.stream_id: s.end_offset for s in streams} == {a: 1, b: 0}
    assert [c.stream_id for c in chunks] == [a]


def test_max_inflight_flushes_must_be_at_least_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        WalSettings(max_inflight_flushes=0)
    with pytest.raises(ConfigError, match=r"wal\.max\.inflight\.flushes: at least 1.*got 0"):
        load_settings({"data.dir": str(tmp_path), "wal.max.inflight.flushes": "0"}, environ={})
    flags = {"data.dir": str(tmp_path), "wal.max.inflight.flushes": "2"}
    assert load_settings(flags, environ={}).wal_max_inflight_flushes == 2


async def test_a_flush_takes_at_most_flush_max_bytes(small_env: Env) -> None:
    """What arrives while every flush slot is busy goes into objects of at most
    flush.max.bytes (at least one append each), not one object as large as all of it."""
    log, store, meta, (a, b) = small_env
    store.hold(0)
    _, first = log.append(a, 1, 0, data60("a0"))
    await store.seen("start 0")
    later = [log.append((a, b)[i % 2], 1, 0, data60(f"x{i}"))[1] for i in range(3)]
    store.release(0)
    assert [await outcome(f) for f in (first, *later)] == [0, 1, 0, 2]
    assert sum(e.startswith("start") for e in store.events) == 4  # 60 + 60 > 100: one each
    assert [c[0] for c in await log.read(a, 0, 1 << 20)] == [0, 1, 2]
    _streams, chunks = await meta.load()
    assert len({c.object_id for c in chunks}) == 4


async def test_room_waits_while_too_much_is_not_yet_committed(small_env: Env) -> None:
    """A producer faster than the store waits in `room()` until flushes commit (the limit
    here: 200 bytes), then goes on; nothing is lost meanwhile."""
    log, store, _meta, (a, b) = small_env
    await asyncio.wait_for(log.room(), WAIT)  # nothing held yet: at once
    store.hold(0)
    _, first = log.append(a, 1, 0, data60("a0"))
    await store.seen("start 0")
    later = [log.append(b, 1, 0, data60(f"b{i}"))[1] for i in range(3)]  # 240 bytes held
    waiting = asyncio.create_task(log.room())
    await asyncio.sleep(0.05)
    assert not waiting.done(), "room() returned with 240 of 200 bytes not committed"
    store.release(0)
    await asyncio.wait_for(waiting, WAIT)  # flush 0 committed: 180 bytes left
    assert [await outcome(f) for f in (first, *later)] == [0, 0, 1, 2]
    await asyncio.wait_for(log.room(), WAIT)


async def test_a_view_into_a_request_frame_counts_for_the_whole_frame(small_env: Env) -> None:
    """Record sets arrive as views into their request's frame (broker/protocol/
    producerequest.py), which stays in memory as long as any of them is not committed: a
    small append from a large frame holds the frame, so it counts for all of it, once (the
    appends right after it from the same frame count for nothing). Otherwise a client sending
    large requests of which little is appended (other partitions failing) could make the
    broker hold far more than the limit while the store is slow."""
    log, store, _meta, (a, b) = small_env
    store.hold(0)
    _, first = log.append(a, 1, 0, data60("a0"))
    await store.seen("start 0")
    frame = bytearray(300)
    view = memoryview(frame)
    frame_appends = [log.append(b, 1, 0, lambda base, i=i: view[i * 10 : i * 10 + 10])[1]
                     for i in range(3)]
    assert log.unflushed_bytes == 60 + 300  # not 60 + 30
    waiting = asyncio.create_task(log.room())
    await asyncio.sleep(0.05)
    assert not waiting.done(), "room() returned with a 300-byte frame held"
    other = bytearray(50)
    _, last = log.append(b, 1, 0, lambda base: memoryview(other)[:5])
    assert log.unflushed_bytes == 60 + 300 + 50  # another frame: counted again
    store.release(0)
    await asyncio.wait_for(waiting, WAIT)
    assert [await outcome(f) for f in (first, *frame_appends, last)] == [0, 0, 1, 2, 3]
    await asyncio.wait_for(log.room(), WAIT)
    assert log.unflushed_bytes == 0


async def test_room_returns_when_the_log_closes(small_env: Env) -> None:
    log, store, _meta, (a, _b) = small_env
    store.hold(0)
    _, first = log.append(a, 1, 0, data60("a0"))
    await store.seen("start 0")
    rest = [log.append(a, 1, 0, data60(f"a{i}"))[1] for i in range(1, 4)]
    waiting = asyncio.create_task(log.room())
    await asyncio.sleep(0.02)
    assert not waiting.done()
    closing = asyncio.create_task(log.close())
    await asyncio.wait_for(waiting, WAIT)  # before the flush in flight is released
    assert not closing.done()
    store.release(0)
    await asyncio.wait_for(closing, WAIT)
    assert [await outcome(f) for f in (first, *rest)] == [0, 1, 2, 3]  # close flushes them


def test_inflight_flushes_default_by_object_store(tmp_path: Path) -> None:
    """Unset, wal.max.inflight.flushes is 1 on a local directory (its uploads are the broker's
    own CPU and disk: in parallel they only got slower) and 2 on S3 (uploads wait on the
    network); set, it is what was set, on either."""
    from broker.app import build_storage

    def inflight(extra: dict[str, str]) -> int:
        flags = {"data.dir": str(tmp_path), "metadata": f"sqlite:///{tmp_path}/m.db", **extra}
        return build_storage(load_settings(flags, environ={})).log.settings.max_inflight_flushes

    s3 = {"object.store": "s3://bucket/log?endpoint=http://127.0.0.1:9&region=us-east-1"}
    assert inflight({}) == 1
    assert inflight({"object.store": (tmp_path / "objects").as_uri()}) == 1
    assert inflight(s3) == 2
    assert inflight({"wal.max.inflight.flushes": "3"}) == 3
    assert inflight({**s3, "wal.max.inflight.flushes": "4"}) == 4
