"""Upsert / CDC table topics (tabletopic.upsert): a batch reduced to the latest row per key,
deletes applied, commits replacing the keys they touch (copy-on-write) through the broker's
own commit, replays refused, composite keys, and upserts into a partitioned table."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException

from tabletopic.commit import commit_offsets, prepare, send
from tabletopic.contract import table_offsets
from tabletopic.convert import KAFKA_TYPE
from tabletopic.partitioning import Layout, parse_partition_by
from tabletopic.transformconvert import CDC_TYPE
from tabletopic.upsert import Upsert, latest_rows

IDENT = ("ns", "cdc")
UPSERT = Upsert(("id",), "_cdc.op")
Event = tuple[int, str, int, str]  # (partition, op, id, name)


def batch(events: list[Event], offsets: dict[int, int]) -> pa.Table:
    """Debezium-flattened rows (tabletopic.transformconvert) of `events`, numbered from the
    partitions' next `offsets` (advanced)."""
    kafka: list[dict[str, Any]] = []
    cdc: list[dict[str, Any]] = []
    for p, op, _i, _n in events:
        kafka.append({"partition": p, "offset": offsets.get(p, 0), "timestamp": None,
                      "key": None, "headers": []})
        cdc.append({"op": op, "ts": 0, "offset": offsets.get(p, 0), "source": "db.t"})
        offsets[p] = offsets.get(p, 0) + 1
    return pa.table({"_kafka": pa.array(kafka, KAFKA_TYPE),
                     "id": pa.array([e[2] for e in events], pa.int64()),
                     "name": pa.array([e[3] for e in events], pa.string()),
                     "_cdc": pa.array(cdc, CDC_TYPE)})


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog("floe", uri=f"sqlite:///{tmp_path / 'c.db'}",
                     warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("ns")
    cat.create_table(IDENT, schema=pa.schema([pa.field("_kafka", KAFKA_TYPE, nullable=False)]),
                     properties={"format-version": "2", "floe.topic": "cdc"})
    return cat


def state(cat: SqlCatalog) -> dict[Any, str]:
    out: dict[Any, str] = {}
    for r in cat.load_table(IDENT).scan(selected_fields=("id", "name")).to_arrow().to_pylist():
        assert r["id"] not in out, f"key {r['id']} twice"
        out[r["id"]] = r["name"]
    return out


def test_latest_row_per_key_and_deletes() -> None:
    data = batch([(0, "I", 1, "a"), (0, "U", 1, "b"), (1, "I", 2, "x"), (0, "U", 1, "c"),
                  (1, "D", 2, "x"), (0, "I", 3, "q"), (1, "I", 2, "y"), (0, "D", 3, "q")], {})
    reduced = latest_rows(data, UPSERT)
    assert reduced is not None
    assert sorted(reduced.keys) == [(1,), (2,), (3,)]
    assert dict(zip(reduced.rows.column("id").to_pylist(),
                    reduced.rows.column("name").to_pylist(), strict=True)) == {1: "c", 2: "y"}
    nulls = batch([(0, "I", 1, "a"), (0, "I", 1, "b")], {}).set_column(
        1, "id", pa.array([None, None], pa.int64()))
    kept = latest_rows(nulls, UPSERT)
    assert kept is not None and kept.rows.num_rows == 2 and kept.keys == []  # no key: appended
    assert latest_rows(data.drop_columns(["id"]), UPSERT) is None


def test_stream_of_commits_ends_in_the_final_state(catalog: SqlCatalog) -> None:
    rng = random.Random(7)
    model: dict[int, str] = {}
    offsets: dict[int, int] = {}
    for c in range(8):
        events: list[Event] = []
        for n in range(300):
            key = rng.randrange(120)
            op = "D" if key in model and rng.random() < 0.2 else ("U" if key in model else "I")
            name = f"c{c}n{n}"
            events.append((key % 2, op, key, name))
            if op == "D":
                model.pop(key)
            else:
                model[key] = name
        start = {p: offsets.get(p, 0) for p in (0, 1)}
        data = batch(events, offsets)
        commit_offsets(catalog, IDENT, "cdc", data, start, dict(offsets), upsert=UPSERT)
        assert state(catalog) == model, f"after commit {c}"
        # the same range again (a writer that lost the answer of a commit that landed)
        commit_offsets(catalog, IDENT, "cdc", data, start, dict(offsets), upsert=UPSERT)
        assert state(catalog) == model
    assert table_offsets(catalog.load_table(IDENT)) == offsets
    snap = catalog.load_table(IDENT).current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary["floe.offsets"] == catalog.load_table(IDENT).properties["floe.offsets"]


def test_composite_keys_and_partitioned_upserts(catalog: SqlCatalog) -> None:
    up = Upsert(("id", "name"), "_cdc.op")
    layout = Layout(parse_partition_by("[bucket(id, 4)]"))
    offsets: dict[int, int] = {}
    first = batch([(0, "I", i % 5, f"n{i % 3}") for i in range(30)], offsets)
    commit_offsets(catalog, IDENT, "cdc", first, {0: 0}, dict(offsets), upsert=up, layout=layout)
    rows = catalog.load_table(IDENT).scan().to_arrow()
    assert rows.num_rows == 15  # 5 ids x 3 names
    second = batch([(0, "D", 1, "n0"), (0, "U", 2, "n1"), (0, "I", 9, "n9")], offsets)
    commit_offsets(catalog, IDENT, "cdc", second, {0: 30}, dict(offsets), upsert=up,
                   layout=layout)
    keys = {(r["id"], r["name"]) for r in
            catalog.load_table(IDENT).scan(selected_fields=("id", "name")).to_arrow().to_pylist()}
    assert keys == ({(i, f"n{j}") for i in range(5) for j in range(3)} - {(1, "n0")}) | {
        (9, "n9")}
    assert catalog.load_table(IDENT).scan().to_arrow().num_rows == 15


def test_only_files_holding_touched_keys_are_rewritten(catalog: SqlCatalog) -> None:
    offsets: dict[int, int] = {}

    def upsert(events: list[Event]) -> None:
        start = {0: offsets.get(0, 0)}
        commit_offsets(catalog, IDENT, "cdc", batch(events, offsets), start, dict(offsets),
                       upsert=UPSERT)

    upsert([(0, "I", i, "a") for i in range(100)])
    upsert([(0, "I", i, "b") for i in range(1000, 1100)])  # beyond the first file's bounds
    table = catalog.load_table(IDENT)
    snap = table.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary.operation.value == "append"
    files = {f["file_path"]: f for f in table.inspect.files().to_pylist()}
    assert len(files) == 2
    upsert([(0, "U", 5, "c"), (0, "D", 6, "")])
    table = catalog.load_table(IDENT)
    snap = table.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary.operation.value == "overwrite"
    after = {f["file_path"] for f in table.inspect.files().to_pylist()}
    kept = [p for p in files if p in after]
    assert len(kept) == 1 and files[kept[0]]["lower_bounds"] is not None  # the 1000s' file
    got = state(catalog)
    assert got[5] == "c" and 6 not in got and len(got) == 199


def test_lost_race_deletes_only_its_new_files(catalog: SqlCatalog, tmp_path: Path) -> None:
    offsets: dict[int, int] = {}
    first = batch([(0, "I", i, "a") for i in range(50)], offsets)
    commit_offsets(catalog, IDENT, "cdc", first, {0: 0}, dict(offsets), upsert=UPSERT)
    before = {f["file_path"] for f in catalog.load_table(IDENT).inspect.files().to_pylist()}
    second = batch([(0, "U", 1, "b")], offsets)
    parquet = set((tmp_path / "wh").rglob("*.parquet"))
    prepared = prepare(catalog.load_table(IDENT), "cdc", second, {0: 50}, {0: 51},
                       upsert=UPSERT)
    assert prepared is not None
    # a non-floe commit lands first (a Spark rewrite would): the prepared one must fail
    catalog.load_table(IDENT).transaction().set_properties({"other": "x"}).commit_transaction()
    moved = catalog.load_table(IDENT)
    with moved.transaction() as tx, tx.update_snapshot().fast_append():
        pass
    with pytest.raises(CommitFailedException):
        send(catalog, prepared)
    assert all(Path(p.removeprefix("file://")).exists() for p in before)
    assert set((tmp_path / "wh").rglob("*.parquet")) == parquet  # its rewrite is gone
    assert state(catalog) == {i: "a" for i in range(50)}
    commit_offsets(catalog, IDENT, "cdc", second, {0: 50}, {0: 51}, upsert=UPSERT)
    assert state(catalog)[1] == "b"


def test_upsert_with_a_new_column(catalog: SqlCatalog) -> None:
    """A batch bringing a column evolves the schema in the same commit; the rows kept from the
    rewritten file get nulls in it."""
    offsets: dict[int, int] = {}
    first = batch([(0, "I", i, "a") for i in range(10)], offsets)
    commit_offsets(catalog, IDENT, "cdc", first, {0: 0}, dict(offsets), upsert=UPSERT)
    second = batch([(0, "U", 3, "b")], offsets)
    second = second.append_column("tier", pa.array(["gold"]))
    commit_offsets(catalog, IDENT, "cdc", second, {0: 10}, dict(offsets), upsert=UPSERT)
    got = {r["id"]: (r["name"], r["tier"]) for r in catalog.load_table(IDENT).scan(
        selected_fields=("id", "name", "tier")).to_arrow().to_pylist()}
    assert got == {**{i: ("a", None) for i in range(10)}, 3: ("b", "gold")}
