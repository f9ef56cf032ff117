"""Data files written on one broker and committed on another (tabletopic.datafiles): written in
the table's spec and sort, carried as JSON and back field by field, committed as one fast
append that scans (and prunes) like pyiceberg's own append; schema evolution committed alone;
decode refusing malformed text; and what the module relies on in the pinned pyiceberg."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import math
import subprocess
import sys
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DATA_FILE_TYPE, DEFAULT_READ_VERSION, DataFile, FileFormat
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    SetCurrentSchemaUpdate,
    TableRequirement,
    TableUpdate,
)
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, Transform
from pyiceberg.typedef import Record

from tabletopic.commit import UnexpectedUpdates
from tabletopic.datafiles import (
    _FIELDS,
    MissingColumns,
    append_files,
    decode,
    encode,
    evolve_schema,
    write_data_files,
)
from tabletopic.partitioning import SortBy

IDENT = ("ns", "t")
DAY0 = dt.datetime(2026, 3, 1, 12)
SCHEMA = pa.schema([
    pa.field("id", pa.int64()),
    pa.field("name", pa.string()),
    pa.field("ts", pa.timestamp("us")),
    pa.field("x", pa.float64()),
    pa.field("blob", pa.binary()),
])


class HookedCatalog(SqlCatalog):
    """The real SQL catalog; `before_commit`, if set, runs once when the next commit_table is
    called, before the commit goes to the database (another writer's commit)."""

    before_commit: Callable[[], None] | None = None

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> Any:
        hook, self.before_commit = self.before_commit, None
        if hook is not None:
            hook()
        return super().commit_table(table, requirements, updates)


def open_catalog(tmp_path: Path) -> HookedCatalog:
    return HookedCatalog("floe", uri=f"sqlite:///{tmp_path / 'c.db'}",
                         warehouse=(tmp_path / "wh").as_uri())


@pytest.fixture
def catalog(tmp_path: Path) -> HookedCatalog:
    cat = open_catalog(tmp_path)
    cat.create_namespace("ns")
    return cat


def rows(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([None if i % 7 == 6 else "abc"[i % 3] for i in ids], pa.string()),
        "ts": pa.array([DAY0 + dt.timedelta(hours=10 * i) for i in ids], pa.timestamp("us")),
        "x": pa.array([i / 4 for i in ids], pa.float64()),
        "blob": pa.array([bytes([i % 256]) for i in ids], pa.binary()),
    }, schema=SCHEMA)


def make_table(cat: SqlCatalog, schema: pa.Schema = SCHEMA,
               partition: list[tuple[str, Transform[Any, Any], str]] | None = None,
               ident: tuple[str, str] = IDENT) -> Table:
    table = cat.create_table(ident, schema=schema,
                             properties={"format-version": "2", "floe.topic": "t"})
    if partition:
        with table.update_spec() as update:
            for col, transform, name in partition:
                update.add_field(col, transform, name)
        table = cat.load_table(ident)
    return table


def commit(cat: SqlCatalog, files: list[DataFile], props: dict[str, str] | None = None,
           ident: tuple[str, str] = IDENT) -> Table:
    tx = cat.load_table(ident).transaction()
    append_files(tx, files, props or {"floe.test": "1"})
    tx.commit_transaction()
    return cat.load_table(ident)


def fields(f: DataFile) -> dict[str, Any]:
    out = {name: getattr(f, name) for name in _FIELDS}
    out["partition"] = [(type(v), v) for v in f.partition._data]
    out["spec_id"] = f.spec_id
    return out


def scanned(table: Table, row_filter: str | None = None) -> list[dict[str, Any]]:
    scan = table.scan() if row_filter is None else table.scan(row_filter=row_filter)
    out: list[dict[str, Any]] = scan.to_arrow().sort_by("id").to_pylist()
    return out


def test_unpartitioned_round_trip_and_commit(catalog: HookedCatalog) -> None:
    table = make_table(catalog)
    data = rows(50)
    files = write_data_files(table, data)
    assert len(files) == 1
    (f,) = files
    assert f.record_count == 50 and f.file_format == FileFormat.PARQUET
    assert f.lower_bounds and f.upper_bounds and f.column_sizes and f.value_counts
    assert f.null_value_counts[2] == 7  # name: ids 6, 13, ...
    assert f.split_offsets
    text = encode(files)
    json.loads(text)  # plain JSON text
    (back,) = decode(text)
    assert fields(back) == fields(f)
    assert back.lower_bounds == f.lower_bounds and back.upper_bounds == f.upper_bounds
    assert catalog.load_table(IDENT).current_snapshot() is None  # writing committed nothing
    after = commit(catalog, decode(text), {"floe.test": "yes"})
    assert scanned(after) == data.to_pylist()
    snap = after.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary["floe.test"] == "yes" and snap.summary["added-records"] == "50"
    # the bounds made it into the manifest: a filter past every id prunes the file
    assert not list(after.scan(row_filter="id >= 50").plan_files())
    assert len(list(after.scan(row_filter="id >= 49").plan_files())) == 1


def test_empty_rows_write_no_file_and_an_empty_append_is_a_snapshot(
        catalog: HookedCatalog) -> None:
    table = make_table(catalog)
    assert write_data_files(table, rows(0)) == []
    assert decode(encode([])) == []
    after = commit(catalog, [])
    assert after.current_snapshot() is not None and scanned(after) == []


PARTITIONINGS: list[tuple[str, Transform[Any, Any], str, type, str, pc.Expression]] = [
    ("name", IdentityTransform(), "name", str, "name == 'b'", pc.field("name") == "b"),
    ("ts", DayTransform(), "ts_day", int, "ts >= '2026-03-05T00:00:00'",
     pc.field("ts") >= pa.scalar(dt.datetime(2026, 3, 5), pa.timestamp("us"))),
    ("id", BucketTransform(4), "id_bucket_4", int, "id in (3, 17)",
     pc.field("id").isin([3, 17])),
]


@pytest.mark.parametrize("col,transform,name,kind,row_filter,oracle", PARTITIONINGS,
                         ids=["identity", "day", "bucket"])
def test_partitioned_tables(
    catalog: HookedCatalog, col: str, transform: Transform[Any, Any], name: str, kind: type,
    row_filter: str, oracle: pc.Expression,
) -> None:
    table = make_table(catalog, partition=[(col, transform, name)])
    spec = table.spec()
    data = rows(60)
    files = write_data_files(table, data)
    # one file per partition value (null included), each of its rows
    values = transform.pyarrow_transform(table.schema().find_field(col).field_type)(
        data.column(col))
    expected = set(values.to_pylist())
    assert len(files) == len(expected) > 2
    assert {f.partition[0] for f in files} == expected
    assert sum(f.record_count for f in files) == 60
    assert all(f.spec_id == spec.spec_id for f in files)
    decoded = decode(encode(files))
    for a, b in zip(files, decoded, strict=True):
        assert fields(b) == fields(a)
        assert b.partition[0] is None or type(b.partition[0]) is kind
    after = commit(catalog, decoded)
    assert scanned(after) == data.to_pylist()
    # the right rows, from the files of the matching partitions only
    got = scanned(after, row_filter)
    assert got == data.filter(oracle).to_pylist() and got
    matching = set(data.append_column("_p", values).filter(oracle).column("_p").to_pylist())
    planned = {t.file.file_path for t in after.scan(row_filter=row_filter).plan_files()}
    assert planned == {f.file_path for f in files if f.partition[0] in matching}
    assert len(planned) < len(files)


def test_partition_values_of_every_type_round_trip(catalog: HookedCatalog) -> None:
    """Identity partitions on long, string, timestamp, decimal, boolean, binary and double
    columns, nulls included: the values come back with their types, and the files commit
    and scan."""
    schema = pa.schema([
        pa.field("id", pa.int64()), pa.field("name", pa.string()),
        pa.field("ts", pa.timestamp("us")), pa.field("dec", pa.decimal128(9, 2)),
        pa.field("flag", pa.bool_()), pa.field("blob", pa.binary()),
        pa.field("x", pa.float64()),
    ])
    data = pa.table({
        "id": [1, 2, 3], "name": ["a", "b", None],
        "ts": [DAY0, None, DAY0], "dec": [Decimal("1.50"), None, Decimal("-2.25")],
        "flag": [True, False, None], "blob": [b"\x00\xff", None, b""],
        "x": [1.5, -0.0, None],
    }, schema=schema)
    table = make_table(catalog, schema,
                       [(c, IdentityTransform(), c) for c in schema.names])
    files = write_data_files(table, data)
    assert len(files) == 3
    decoded = decode(encode(files))
    for a, b in zip(files, decoded, strict=True):
        assert fields(b) == fields(a)
    by_id = {f.partition[0]: f.partition._data for f in decoded}
    micros = int((DAY0 - dt.datetime(1970, 1, 1)).total_seconds()) * 1_000_000
    assert by_id[1] == [1, "a", micros, Decimal("1.50"), True, b"\x00\xff", 1.5]
    assert by_id[2][:6] == [2, "b", None, None, False, None]
    assert math.copysign(1.0, by_id[2][6]) == -1.0  # -0.0 stays negative zero
    assert by_id[3] == [3, None, micros, Decimal("-2.25"), None, b"", None]
    assert [type(v) for v in by_id[1]] == [int, str, int, Decimal, bool, bytes, float]
    after = commit(catalog, decoded)
    assert scanned(after) == data.to_pylist()
    assert scanned(after, "flag == false") == data.slice(1, 1).to_pylist()


def test_hand_made_values_round_trip() -> None:
    """Every tagged type, including what the writer does not produce from these tables: UUIDs,
    NaN and infinities, big longs; and None for every optional field."""
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    values = [2**62, -1, "é\x00", float("inf"), float("-inf"), True, b"\x01", Decimal("1E-30"),
              u, u.bytes, None]
    f = DataFile.from_args(
        content=0, file_path="s3://b/t/data/x.parquet", file_format=FileFormat.PARQUET,
        partition=Record(*values), record_count=3, file_size_in_bytes=10,
        column_sizes=None, value_counts=None, null_value_counts=None, nan_value_counts=None,
        lower_bounds=None, upper_bounds=None, key_metadata=b"k", split_offsets=None,
        equality_ids=[1, 2], sort_order_id=0,
    )
    f.spec_id = 3
    (back,) = decode(encode([f]))
    assert fields(back) == fields(f)
    nan = DataFile.from_args(partition=Record(float("nan")), **{
        k: getattr(f, k) for k in _FIELDS if k != "partition"})
    nan.spec_id = 0
    (back_nan,) = decode(encode([nan]))
    assert math.isnan(back_nan.partition[0])


def test_sort_by_sorts_rows_within_each_file(catalog: HookedCatalog) -> None:
    table = make_table(catalog, partition=[("name", IdentityTransform(), "name")])
    data = rows(40).take(pa.array([(i * 17) % 40 for i in range(40)]))  # shuffled
    io = PyArrowFileIO(catalog.properties)

    def ids_of(f: DataFile) -> list[int]:
        with io.new_input(f.file_path).open() as stream:
            out: list[int] = pq.read_table(stream).column("id").to_pylist()
        return out

    orders: list[tuple[SortBy | str, ...]] = [("id desc",), (SortBy("id", descending=True),)]
    for order in orders:
        files = write_data_files(table, data, sort_by=order)
        assert len(files) == 4
        for f in files:
            ids = ids_of(f)
            assert ids == sorted(ids, reverse=True) and len(ids) == f.record_count
    files = write_data_files(table, data, sort_by=("x",))
    for f in files:
        ids = ids_of(f)
        assert ids == sorted(ids)


def test_missing_columns_are_refused_clearly(catalog: HookedCatalog) -> None:
    table = make_table(catalog)
    extra = rows(3).append_column("new", pa.array([1, 2, 3]))
    with pytest.raises(MissingColumns, match=r"new.*evolve the schema first") as e:
        write_data_files(table, extra)
    assert e.value.columns == ["new"]
    nested = pa.schema([pa.field("id", pa.int64()),
                        pa.field("s", pa.struct([pa.field("a", pa.int32())]))])
    table = make_table(catalog, nested, ident=("ns", "nested"))
    wider = pa.table({"id": [1], "s": [{"a": 1, "b": "x"}]},
                     schema=pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.struct([
                         pa.field("a", pa.int32()), pa.field("b", pa.string())]))]))
    with pytest.raises(MissingColumns) as e:
        write_data_files(table, wider)
    assert e.value.columns == ["s.b"]
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError):  # a type that does not fit
        write_data_files(table, pa.table({"id": ["not a number"]}))


def test_evolve_schema_commits_the_schema_alone(catalog: HookedCatalog) -> None:
    table = make_table(catalog, pa.schema([pa.field("id", pa.int64()), pa.field(
        "s", pa.struct([pa.field("a", pa.int32())]))]))
    commit(catalog, write_data_files(table, pa.table({"id": [1], "s": [{"a": 1}]},
                                                     schema=table.schema().as_arrow())))
    before = catalog.load_table(IDENT)
    wider = pa.schema([
        pa.field("id", pa.int64()),
        pa.field("s", pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("info", pa.struct([pa.field("k", pa.string())])),
    ])
    after = evolve_schema(catalog, IDENT, wider)
    assert after.schema().find_field("s.b") and after.schema().find_field("tags.element")
    assert after.schema().find_field("info.k")
    assert after.metadata.current_schema_id != before.metadata.current_schema_id
    assert after.current_snapshot() == before.current_snapshot()
    assert len(after.metadata.snapshots) == len(before.metadata.snapshots) == 1
    assert after.properties == before.properties
    # rows of the new schema can now be written and read alongside the old ones
    data = pa.table({"id": [2], "s": [{"a": 2, "b": "x"}], "tags": [["t"]],
                     "info": [{"k": "v"}]}, schema=wider)
    commit(catalog, write_data_files(after, data))
    got = scanned(catalog.load_table(IDENT))
    assert got[1] == data.to_pylist()[0] and got[0]["s"] == {"a": 1, "b": None}
    # a second call has nothing to do: no commit at all
    location = catalog.load_table(IDENT).metadata_location
    assert evolve_schema(catalog, IDENT, wider).metadata_location == location
    assert evolve_schema(catalog, IDENT, SCHEMA.remove(4).remove(3).remove(2).remove(
        1)).metadata_location == location  # a subset of the columns


def test_a_concurrent_schema_change_is_retried(catalog: HookedCatalog, tmp_path: Path) -> None:
    make_table(catalog, pa.schema([pa.field("id", pa.int64())]))
    other = open_catalog(tmp_path)  # another broker
    def other_broker() -> None:
        evolve_schema(other, IDENT, pa.schema([pa.field("id", pa.int64()),
                                               pa.field("b", pa.string())]))

    catalog.before_commit = other_broker
    conflicts: list[BaseException] = []
    after = evolve_schema(catalog, IDENT, pa.schema([
        pa.field("id", pa.int64()), pa.field("a", pa.int32())]), on_retry=conflicts.append)
    assert [type(e) for e in conflicts] == [CommitFailedException]
    assert after.schema().column_names == ["id", "b", "a"]
    assert after.current_snapshot() is None
    ids = [f.field_id for f in after.schema().fields]
    assert len(set(ids)) == 3
    # every schema committed along the way is a table schema; none with a reused column id
    assert len(after.metadata.schemas) == 3


def test_evolve_schema_gives_up_after_its_attempts(
        catalog: HookedCatalog, tmp_path: Path) -> None:
    make_table(catalog, pa.schema([pa.field("id", pa.int64())]))
    other = open_catalog(tmp_path)
    n = 0

    def race() -> None:
        nonlocal n
        n += 1
        evolve_schema(other, IDENT, pa.schema([pa.field(f"c{n}", pa.int64())]))
        catalog.before_commit = race

    catalog.before_commit = race
    with pytest.raises(CommitFailedException):
        evolve_schema(catalog, IDENT, pa.schema([pa.field("a", pa.int32())]), attempts=3)
    assert n == 3
    catalog.before_commit = None


def test_evolve_schema_requires_the_schema_it_read(catalog: HookedCatalog) -> None:
    """What is sent: the schema updates only, under the table UUID, schema id and last column
    id; a commit with more staged updates is refused before it is sent."""
    make_table(catalog, pa.schema([pa.field("id", pa.int64())]))
    sent: list[tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]]] = []
    real = catalog.commit_table

    def spy(table: Table, requirements: tuple[TableRequirement, ...],
            updates: tuple[TableUpdate, ...]) -> Any:
        sent.append((requirements, updates))
        return real(table, requirements, updates)

    catalog.commit_table = spy  # type: ignore[method-assign]
    evolve_schema(catalog, IDENT, pa.schema([pa.field("a", pa.int32())]))
    ((requirements, updates),) = sent
    assert {type(r).__name__ for r in requirements} == {
        "AssertTableUUID", "AssertCurrentSchemaId", "AssertLastAssignedFieldId"}
    assert {type(u) for u in updates} == {AddSchemaUpdate, SetCurrentSchemaUpdate}
    (schema_req,) = [r for r in requirements if isinstance(r, AssertCurrentSchemaId)]
    assert schema_req.current_schema_id == 0

    def staging_more(self: Transaction, *a: Any, **k: Any) -> Any:
        self.set_properties({"x": "y"})
        return original(self, *a, **k)

    original = Transaction.update_schema
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Transaction, "update_schema", staging_more)
        with pytest.raises(UnexpectedUpdates, match="SetPropertiesUpdate"):
            evolve_schema(catalog, IDENT, pa.schema([pa.field("b", pa.int32())]))
    assert len(sent) == 1
    assert "x" not in catalog.load_table(IDENT).properties


def test_append_refuses_files_of_another_spec(catalog: HookedCatalog) -> None:
    table = make_table(catalog)
    files = write_data_files(table, rows(5))
    with table.update_spec() as update:
        update.add_field("name", IdentityTransform(), "name")
    table = catalog.load_table(IDENT)
    with pytest.raises(ValueError, match="partition spec 0"):
        append_files(table.transaction(), decode(encode(files)), {})


def _valid() -> dict[str, Any]:
    f = DataFile.from_args(
        content=0, file_path="file:///x.parquet", file_format=FileFormat.PARQUET,
        partition=Record(1, "a"), record_count=1, file_size_in_bytes=1, column_sizes={1: 2},
        value_counts={1: 1}, null_value_counts={1: 0}, nan_value_counts={},
        lower_bounds={1: b"\x01"}, upper_bounds={1: b"\x02"}, key_metadata=None,
        split_offsets=[4], equality_ids=None, sort_order_id=None)
    f.spec_id = 0
    doc: dict[str, Any] = json.loads(encode([f]))
    decode(json.dumps(doc))  # valid as it is
    return doc


def _with(change: Callable[[dict[str, Any]], None]) -> str:
    doc = _valid()
    change(doc)
    return json.dumps(doc)


def _file(**kv: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["files"][0].update(kv)
    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        del doc["files"][0][key]
    return change


MALFORMED: dict[str, str] = {
    "not json": "{files: [",
    "empty": "",
    "NaN constant": '{"format": 1, "files": [NaN]}',
    "a list": "[]",
    "no format": '{"files": []}',
    "other format": '{"format": 2, "files": []}',
    "format true": '{"format": true, "files": []}',
    "files not a list": '{"format": 1, "files": {}}',
    "file not an object": '{"format": 1, "files": [1]}',
    "duplicate key": '{"format": 1, "format": 1, "files": []}',
    "deep": "[" * 100_000 + "]" * 100_000,
    "missing path": _with(_drop("file_path")),
    "missing spec": _with(_drop("spec_id")),
    "unknown field": _with(_file(extra=1)),
    "path a number": _with(_file(file_path=3)),
    "empty path": _with(_file(file_path="")),
    "count a string": _with(_file(record_count="1")),
    "count a bool": _with(_file(record_count=True)),
    "count a float": _with(_file(record_count=1.0)),
    "count negative": _with(_file(record_count=-1)),
    "size too big": _with(_file(file_size_in_bytes=2**64)),
    "content unknown": _with(_file(content=7)),
    "format unknown": _with(_file(file_format="CSV")),
    "format lower case": _with(_file(file_format="parquet")),
    "partition not a list": _with(_file(partition={"a": 1})),
    "partition untagged": _with(_file(partition=[1])),
    "partition tag unknown": _with(_file(partition=[{"type": "date", "value": 1}])),
    "partition tag missing": _with(_file(partition=[{"value": 1}])),
    "partition int a string": _with(_file(partition=[{"type": "int", "value": "1"}])),
    "partition bool an int": _with(_file(partition=[{"type": "bool", "value": 1}])),
    "partition float decimal": _with(_file(partition=[{"type": "float", "value": 1.5}])),
    "partition float junk": _with(_file(partition=[{"type": "float", "value": "x"}])),
    "partition bytes junk": _with(_file(partition=[{"type": "bytes", "value": "!!"}])),
    "partition bytes non-ascii": _with(_file(partition=[{"type": "bytes", "value": "é"}])),
    "partition decimal junk": _with(_file(partition=[{"type": "decimal", "value": "1.x"}])),
    "partition decimal nan": _with(_file(partition=[{"type": "decimal", "value": "NaN"}])),
    "partition uuid junk": _with(_file(partition=[{"type": "uuid", "value": "nope"}])),
    "counts a list": _with(_file(value_counts=[1])),
    "counts key junk": _with(_file(value_counts={"a": 1})),
    "counts key float": _with(_file(value_counts={"1.0": 1})),
    "counts key huge": _with(_file(value_counts={"99999999999": 1})),
    "counts value string": _with(_file(value_counts={"1": "1"})),
    "bounds not base64": _with(_file(lower_bounds={"1": "***"})),
    "bounds value int": _with(_file(upper_bounds={"1": 5})),
    "key metadata int": _with(_file(key_metadata=5)),
    "split offsets not a list": _with(_file(split_offsets=4)),
    "split offsets strings": _with(_file(split_offsets=["4"])),
    "equality ids nulls": _with(_file(equality_ids=[None])),
    "sort order id a string": _with(_file(sort_order_id="0")),
    "spec id negative": _with(_file(spec_id=-1)),
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_decode_refuses_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match=r"data files|files\[0\]"):
        decode(text)


def test_decode_refuses_what_is_not_text() -> None:
    with pytest.raises(ValueError):
        decode(b'{"format": 1, "files": []}')  # type: ignore[arg-type]


# --- what tabletopic.datafiles relies on in pyiceberg (see its docstring) -------------------


def test_pin_pyarrow_write_internals(catalog: HookedCatalog) -> None:
    """The two underscore functions, their parameters and behaviour; Transaction.append still
    takes the same two steps (with the downcast setting) before it stages files."""
    from pyiceberg.io import pyarrow as pio
    from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE

    assert list(inspect.signature(pio._check_pyarrow_schema_compatible).parameters) == [
        "requested_schema", "provided_schema", "downcast_ns_timestamp_to_us", "format_version"]
    assert list(inspect.signature(pio._dataframe_to_data_files).parameters) == [
        "table_metadata", "df", "io", "write_uuid", "counter"]
    append = inspect.getsource(Transaction.append)
    for step in ["_check_pyarrow_schema_compatible(", "_dataframe_to_data_files(",
                 "Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE)",
                 "downcast_ns_timestamp_to_us=downcast_ns_timestamp_to_us",
                 "format_version=self.table_metadata.format_version"]:
        assert step in append, f"Transaction.append no longer does {step!r}"
    assert DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE == "downcast-ns-timestamp-to-us-on-write"

    table = make_table(catalog, partition=[("name", IdentityTransform(), "name")])
    with pytest.raises(ValueError, match="more columns"):
        pio._check_pyarrow_schema_compatible(
            table.schema(), provided_schema=rows(1).append_column("z", pa.array([1])).schema,
            downcast_ns_timestamp_to_us=False, format_version=2)
    pio._check_pyarrow_schema_compatible(table.schema(), rows(1).schema, False, 2)
    data = rows(8).take(pa.array([7, 0, 6, 1, 5, 2, 4, 3]))
    files = list(pio._dataframe_to_data_files(
        table_metadata=table.metadata, io=table.io, df=data, write_uuid=uuid.uuid4()))
    assert all(isinstance(f, DataFile) for f in files)
    assert sorted(f.partition[0] or "" for f in files) == ["", "a", "b", "c"]
    # rows keep their input order within a partition (sort_rows relies on it)
    io = PyArrowFileIO(catalog.properties)
    for f in files:
        with io.new_input(f.file_path).open() as stream:
            ids = pq.read_table(stream).column("id").to_pylist()
        order = [i for i in data.column("id").to_pylist() if i in ids]
        assert ids == order

    # the same files, partition for partition, as pyiceberg's own append writes
    twin = make_table(catalog, partition=[("name", IdentityTransform(), "name")],
                      ident=("ns", "twin"))
    twin.append(data)
    theirs = twin.inspect.files().select(["partition", "record_count"]).to_pylist()
    ours = [{"partition": {"name": f.partition[0]}, "record_count": f.record_count}
            for f in files]
    key: Callable[[dict[str, Any]], Any] = lambda r: str(r["partition"])  # noqa: E731
    assert sorted(theirs, key=key) == sorted(ours, key=key)


def test_pin_data_file_layout_and_staging() -> None:
    """DataFile.from_args builds the v2 layout whose fields are exactly the ones encoded, and
    ignores spec_id (set afterwards); a schema union stages only the schema updates."""
    assert DEFAULT_READ_VERSION == 2
    assert tuple(f.name for f in DATA_FILE_TYPE[DEFAULT_READ_VERSION].fields) == _FIELDS
    args: dict[str, Any] = {name: i for i, name in enumerate(_FIELDS)}
    f = DataFile.from_args(**args, spec_id=5)
    assert [getattr(f, name) for name in _FIELDS] == list(range(len(_FIELDS)))
    with pytest.raises(AttributeError):
        f.spec_id  # noqa: B018
    f.spec_id = 5
    assert f.spec_id == 5


def test_pin_transaction_updates_and_fast_append(catalog: HookedCatalog) -> None:
    table = make_table(catalog)
    tx = table.transaction()
    with tx.update_schema() as update:
        update.union_by_name(pa.schema([pa.field("new", pa.int32())]))
    assert isinstance(tx._updates, tuple)
    assert [type(u) for u in tx._updates] == [AddSchemaUpdate, SetCurrentSchemaUpdate]
    # a fast append lists its files in a manifest of the table's current default spec
    source = inspect.getsource(
        __import__("pyiceberg.table.update.snapshot", fromlist=["_SnapshotProducer"])
        ._SnapshotProducer._manifests)
    assert "spec=self._transaction.table_metadata.spec()" in source


ODD_VALUES: list[Any] = [None, True, False, 0, -1, 2**70, 1.5, "", "x", "AA==", [], [None], [1],
                         {}, {"1": None}, {"type": "int"}, {"type": "int", "value": None}]


def test_decode_of_any_mutated_field_is_a_value_or_a_value_error() -> None:
    """Every field of a valid text (and every place inside one) replaced by odd values: decode
    returns files or raises ValueError, nothing else."""
    outcomes = {"ok": 0, "refused": 0}

    def attempt(doc: dict[str, Any]) -> None:
        try:
            decode(json.dumps(doc))
            outcomes["ok"] += 1
        except ValueError:
            outcomes["refused"] += 1

    for key in [*_valid()["files"][0], "format", "files"]:
        for odd in ODD_VALUES:
            doc = _valid()
            if key in ("format", "files"):
                doc[key] = odd
            else:
                doc["files"][0][key] = odd
            attempt(doc)
    for key in ["partition", "column_sizes", "lower_bounds", "split_offsets"]:
        for odd in ODD_VALUES:
            doc = _valid()
            inner = doc["files"][0][key]
            if isinstance(inner, list):
                inner[0] = odd
            else:
                inner["1"] = odd
            attempt(doc)
    assert outcomes["ok"] and outcomes["refused"] > outcomes["ok"]


def test_append_refuses_delete_files(catalog: HookedCatalog) -> None:
    table = make_table(catalog)
    (f,) = write_data_files(table, rows(3))
    doc = json.loads(encode([f]))
    doc["files"][0]["content"] = 1  # position deletes
    with pytest.raises(ValueError, match="not a data file"):
        append_files(table.transaction(), decode(json.dumps(doc)), {})


def test_the_schema_check_runs_once_per_schema_and_failures_every_time(
    catalog: HookedCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_data_files takes pyiceberg's schema check once per (table, schema id, format,
    downcast setting, Arrow schema with field metadata); a check that fails is not
    remembered: the same rows are refused every time."""
    from pyiceberg.io import pyarrow as pio

    calls: list[pa.Schema] = []
    real = pio._check_pyarrow_schema_compatible

    def counting(requested: Any, provided_schema: pa.Schema, **kw: Any) -> None:
        calls.append(provided_schema)
        real(requested, provided_schema=provided_schema, **kw)

    monkeypatch.setattr(pio, "_check_pyarrow_schema_compatible", counting)
    table = make_table(catalog)
    for start in (0, 10, 20):
        write_data_files(table, rows(3, start))
    assert len(calls) == 1
    with_id = rows(3).schema.set(0, pa.field("id", pa.int64(), metadata={
        b"PARQUET:field_id": b"1"}))
    write_data_files(table, rows(3).cast(with_id))  # field metadata: checked again
    assert len(calls) == 2
    twin = make_table(catalog, ident=("ns", "twin"))  # another table: checked again
    write_data_files(twin, rows(3))
    assert len(calls) == 3
    evolve_schema(catalog, IDENT, rows(1).append_column("z", pa.array([1])).schema)
    write_data_files(catalog.load_table(IDENT), rows(3))  # a new schema id: checked again
    assert len(calls) == 4
    bad = pa.table({"id": ["not a number"]})
    for _ in range(2):
        with pytest.raises(ValueError):
            write_data_files(table, bad)
    assert len(calls) == 6


def test_a_first_write_imports_nothing() -> None:
    """What pyiceberg imports on its first write (rich, for the schema check's report) comes
    with the table stack (tabletopic.writer, imported by tabletopic.lazyload in a thread),
    not on the first write of a broker after its start or a failover."""
    code = """
import sys, tempfile
import pyarrow as pa
import tabletopic.writer
from pyiceberg.catalog.sql import SqlCatalog
from tabletopic.datafiles import decode, encode, evolve_schema, write_data_files
d = tempfile.mkdtemp()
cat = SqlCatalog("t", uri=f"sqlite:///{d}/c.db", warehouse=f"file://{d}/wh")
cat.create_namespace("ns")
data = pa.table({"id": pa.array([1, 2], pa.int64()), "s": pa.array(["a", "b"])})
cat.create_table("ns.t", schema=data.schema, properties={"format-version": "2"})
before = set(sys.modules)
table = evolve_schema(cat, "ns.t", data.schema)
decode(encode(write_data_files(table, data)))
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]", f"the first write imported {out.strip()}"
