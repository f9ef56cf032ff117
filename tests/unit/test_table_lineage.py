"""tabletopic.lineage on a real SQL catalog (floe commits through tabletopic.commit), locate()
over rewinds and rollbacks, and the pause state in the metadata store (SQLite, PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException

from broker.metadata.tablestate import TableStates
from s3stream.metadata import open_metadata_store
from tabletopic.api import parse_from
from tabletopic.commit import commit_offsets
from tabletopic.lineage import lineage, locate, render
from tabletopic.ops import OperationError
from tabletopic.replay import DlqReplay, ranges

IDENT = ("ns", "t")
SCHEMA = pa.schema([pa.field("partition", pa.int32()), pa.field("offset", pa.int64())])


def rows(p: int, a: int, b: int) -> pa.Table:
    return pa.table({"partition": [p] * (b - a), "offset": list(range(a, b))}, schema=SCHEMA)


def test_lineage_ranges_rollback_and_locate(tmp_path: Path) -> None:
    cat = SqlCatalog("floe", uri=f"sqlite:///{tmp_path / 'c.db'}",
                     warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("ns")
    cat.create_table(IDENT, schema=SCHEMA, properties={"floe.topic": "t"})
    commit_offsets(cat, IDENT, "t", rows(0, 0, 5), {0: 0}, {0: 5})
    commit_offsets(cat, IDENT, "t", rows(1, 0, 3), {1: 0}, {1: 3})
    commit_offsets(cat, IDENT, "t", None, {0: 5}, {0: 8})  # all dead letters
    first, second, third = [s.snapshot_id for s in cat.load_table(IDENT).snapshots()]
    doc = lineage(cat.load_table(IDENT))
    assert [s["ranges"] for s in doc["snapshots"]] == [
        {"0": [None, 5]}, {"1": [None, 3]}, {"0": [5, 8]}]
    assert [s["added_records"] for s in doc["snapshots"]] == [5, 3, 0]
    assert doc["current"] == third and not any(s["rolled_back"] for s in doc["snapshots"])
    assert locate(doc, 0, 4)["snapshot_id"] == first  # type: ignore[index]
    assert locate(doc, 1, 2)["snapshot_id"] == second  # type: ignore[index]
    assert locate(doc, 1, 3) is None

    cat.load_table(IDENT).manage_snapshots().set_current_snapshot(first).commit()
    doc = lineage(cat.load_table(IDENT))
    assert [s["rolled_back"] for s in doc["snapshots"]] == [False, True, True]
    assert locate(doc, 1, 2) is None  # only in a rolled-back snapshot
    assert [h["snapshot"] for h in doc["history"]][-1] == first
    text = render("t", doc)
    assert f"* {first:>20}" in text and f"x {second:>20}" in text and "p0:[5,8)" in text


def snap(sid: int, ranges: dict[str, list[int | None]], rolled_back: bool = False
         ) -> dict[str, Any]:
    return {"snapshot_id": sid, "ranges": ranges, "rolled_back": rolled_back}


def test_locate_follows_rewinds() -> None:
    doc = {"snapshots": [
        snap(1, {"0": [None, 10]}),
        snap(2, {"0": [10, 20]}),
        snap(3, {"0": [20, 15]}),  # a rebuild from offset 15
        snap(4, {"0": [15, 30]}),
        snap(5, {"0": [30, 40]}, rolled_back=True),
    ]}
    assert [locate(doc, 0, o)["snapshot_id"] for o in (0, 14, 15, 19, 29)] == [  # type: ignore[index]
        1, 2, 4, 4, 4]
    assert locate(doc, 0, 30) is None and locate(doc, 1, 0) is None
    doc["snapshots"].append({**snap(6, {}), "rebuilt": {"0": [12, 30]}})  # rewritten in place
    assert [locate(doc, 0, o)["snapshot_id"] for o in (11, 12, 29)] == [  # type: ignore[index]
        2, 6, 6]


def test_parse_from_and_ranges() -> None:
    assert parse_from("0:5,2:7") == {0: 5, 2: 7}
    for bad in ("0", "a:1", "0:-1", ""):
        with pytest.raises(ValueError):
            parse_from(bad)
    assert ranges([5, 1, 2, 3, 9]) == [[1, 4], [5, 6], [9, 10]]
    assert ranges([]) == []


@pytest.fixture(params=["sqlite", "postgresql"])
def meta_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return str(request.getfixturevalue("pg_url"))


async def test_pause_state_in_the_metadata_store(meta_url: str) -> None:
    store = open_metadata_store(meta_url)
    await store.open()
    try:
        states = TableStates(store)
        await states.open()
        await states.open()  # migrations run once
        assert await states.all() == {}
        await states.set("a", True, "drill")
        await states.set("b", True, "x")
        await states.set("b", False, "")
        got = await states.all()
        assert {t: (s.paused, s.reason) for t, s in got.items()} == {
            "a": (True, "drill"), "b": (False, "")}
        assert not await states.clear_if("a", "rebuild in progress")  # an operator's pause
        await states.set("c", True, "rebuild in progress")
        assert await states.clear_if("c", "rebuild in progress")
        assert not (await states.all())["c"].paused
        await states.delete("a")
        await states.delete("c")
        assert set(await states.all()) == {"b"}
    finally:
        await store.close()


class Racing(DlqReplay):
    """A replay whose first `losses` attempts lose a commit race; records whether each attempt
    ran with the writer held."""

    def __init__(self, losses: int) -> None:
        super().__init__(None, None, None)  # type: ignore[arg-type]
        self.losses, self.held = losses, False
        self.attempts: list[bool] = []

    async def _attempt(self, topic: str, cfg: Any, dry_run: bool) -> dict[str, Any]:
        self.attempts.append(self.held)
        if len(self.attempts) <= self.losses:
            raise CommitFailedException("the table moved")
        return {"ok": True}


async def test_replay_holds_the_writer_after_lost_races() -> None:
    def hold(r: Racing) -> Any:
        @asynccontextmanager
        async def held() -> AsyncIterator[None]:
            r.held = True
            try:
                yield
            finally:
                r.held = False
        return held

    r = Racing(losses=1)
    assert await r.run("t", None, False, hold(r)) == {"ok": True}  # type: ignore[arg-type]
    assert r.attempts == [False, False]
    r = Racing(losses=3)
    assert await r.run("t", None, False, hold(r)) == {"ok": True}  # type: ignore[arg-type]
    assert r.attempts == [False, False, True, True]
    r = Racing(losses=9)
    with pytest.raises(OperationError, match="lost 5 commit races"):
        await r.run("t", None, False, hold(r))  # type: ignore[arg-type]
