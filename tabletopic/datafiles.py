"""Iceberg data files written on one broker and committed on another.

With the table writer split across a cluster, the broker leading a Kafka partition (a worker)
writes that partition's rows as Parquet data files of the table (`write_data_files`), without
committing anything; the files' descriptions travel to the coordinator as JSON text (`encode`,
`decode`), and the coordinator stages the files of every partition as one fast append
(`append_files`) in the exactly-once commit of tabletopic.commit. A worker whose rows bring new
columns first evolves the table's schema on its own (`evolve_schema`), since data files can
only be written in a schema the table holds.

What this rests on in pyiceberg (pinned in pyproject.toml to 0.12.x; every point below is
checked by tests/unit/test_datafiles.py, which fails when a version changes it):

  - `pyiceberg.io.pyarrow._check_pyarrow_schema_compatible(requested_schema, provided_schema,
    downcast_ns_timestamp_to_us, format_version)` raises ValueError when an Arrow schema does
    not fit a table schema, and `_dataframe_to_data_files(table_metadata, df, io, write_uuid)`
    writes a `pa.Table` as data files of the table's current schema and default partition
    spec (bin-packed by `write.target-file-size-bytes`, one file or more per partition value,
    rows in their input order within a partition), returning their `DataFile`s. These are the
    two steps `Transaction.append` takes before it stages the files; we call them with the
    same arguments, the downcast setting read the same way (`Config().get_bool(
    DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE)`), and skip empty input as append does.
  - `DataFile.from_args(**fields)` builds a DataFile of the v2 layout (DEFAULT_READ_VERSION:
    the layout pyiceberg's own writer builds for every table version), ignoring names that
    are not fields of it: `decode` builds files the same way, from the fields named in
    `_FIELDS`, which must be all the fields of that layout. from_args ignores `spec_id` (the
    writer passes it, in vain); it is set afterwards through the `spec_id` attribute.
  - `Transaction._updates` holds the updates a transaction staged (as tabletopic.commit reads
    them); a schema union stages AddSchemaUpdate and SetCurrentSchemaUpdate only.
  - a fast append (`UpdateSnapshot.fast_append`) writes the files appended to it into a
    manifest of the table's current default spec, whatever spec they were written in: hence
    `append_files` refuses files of another spec.
  - the schema check's visitor imports `rich.console` and `rich.table` on its first use
    (~45 ms, once per process): imported here instead, with the table stack (which
    tabletopic.lazyload imports in a thread), so a broker's first write (after a start or a
    failover) does not wait for it; the check's outcome depends only on the table's schema
    (by table uuid and schema id: a schema id's fields never change), the format version,
    the downcast setting and the Arrow schema (field metadata included), so it is taken
    once per such key (`_check_schema`). tests/unit/test_datafiles.py checks that a first
    write imports nothing.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE, Table, Transaction
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    AssertLastAssignedFieldId,
    AssertTableUUID,
    SetCurrentSchemaUpdate,
    TableRequirement,
    TableUpdate,
)
from pyiceberg.typedef import Record
from pyiceberg.utils.config import Config
from rich import console as _rich_console  # noqa: F401 - see the module docstring
from rich import table as _rich_table  # noqa: F401

from tabletopic.commit import COMMIT_RETRY, UnexpectedUpdates, covers
from tabletopic.partitioning import SortBy, parse_sort_by
from tabletopic.rowsort import sort_rows

log = logging.getLogger(__name__)

FORMAT = 1  # the version of the JSON encoding; decode refuses any other
# The fields of a DataFile (pyiceberg 0.12's v2 layout), all of which are encoded.
_FIELDS = (
    "content", "file_path", "file_format", "partition", "record_count", "file_size_in_bytes",
    "column_sizes", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds",
    "upper_bounds", "key_metadata", "split_offsets", "equality_ids", "sort_order_id",
)
_COUNTS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
_BOUNDS = ("lower_bounds", "upper_bounds")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class MissingColumns(ValueError):
    """Rows hold columns the table's schema does not: evolve the schema first
    (`evolve_schema`)."""

    def __init__(self, columns: list[str]) -> None:
        super().__init__(
            f"the table's schema lacks column(s) {', '.join(columns)} of the rows: evolve the "
            "schema first (tabletopic.datafiles.evolve_schema)"
        )
        self.columns = columns


# --- writing -------------------------------------------------------------------------------


def write_data_files(
    table: Table, data: pa.Table, sort_by: tuple[SortBy | str, ...] = ()
) -> list[DataFile]:
    """Write `data` as Parquet data files of `table` (its current schema and partition spec:
    one file per partition value, more only past `write.target-file-size-bytes`), the rows of
    each file sorted by `sort_by` (SortBy, or `col [asc|desc] [nulls first|last]` text as in
    `table.topic.sort.by`). Commits nothing. Raises MissingColumns when the table's schema
    lacks a column (or nested field) of `data`, ValueError when a column's type does not fit.
    Each DataFile's `spec_id` is the spec it was written in."""
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _dataframe_to_data_files

    meta = table.metadata
    missing = _missing_columns(meta.schema(), data.schema)
    if missing:
        raise MissingColumns(missing)
    downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
    key = _SchemaKey(meta.table_uuid, meta.current_schema_id, meta.format_version, downcast,
                     data.schema.to_string(show_field_metadata=True,
                                           show_schema_metadata=False))
    _check_schema(key, lambda: _check_pyarrow_schema_compatible(
        meta.schema(),
        provided_schema=data.schema,
        downcast_ns_timestamp_to_us=downcast,
        format_version=meta.format_version,
    ))
    if data.num_rows == 0:
        return []
    order = tuple(s for item in sort_by for s in _sort_items(item))
    files = list(_dataframe_to_data_files(
        table_metadata=meta, io=table.io, df=sort_rows(data, order), write_uuid=uuid.uuid4()
    ))
    for f in files:
        f.spec_id = meta.default_spec_id
    return files


@dataclass(frozen=True)
class _SchemaKey:
    """What pyiceberg's schema check depends on (see the module docstring)."""

    table_uuid: uuid.UUID
    schema_id: int
    format_version: int
    downcast: bool
    arrow_schema: str  # with field metadata (field ids, when set, decide the match)


_passed: dict[_SchemaKey, None] = {}  # keys whose check passed, oldest first
_passed_lock = threading.Lock()  # writers check from several threads
_PASSED_MAX = 256


def _check_schema(key: _SchemaKey, check: Callable[[], None]) -> None:
    """`check()` unless it passed for `key` already; a failure is not remembered (it raises
    every time)."""
    with _passed_lock:
        if key in _passed:
            return
    check()
    with _passed_lock:
        _passed[key] = None
        while len(_passed) > _PASSED_MAX:
            del _passed[next(iter(_passed))]


def _sort_items(item: SortBy | str) -> tuple[SortBy, ...]:
    return (item,) if isinstance(item, SortBy) else parse_sort_by(item)


def _missing_columns(schema: Schema, arrow: pa.Schema) -> list[str]:
    """The columns and nested fields of `arrow` that `schema` lacks, by full (dotted) name as
    pyiceberg names them (a list's `.element`, a map's `.key` / `.value`)."""
    out: list[str] = []

    def has(name: str) -> bool:
        try:
            schema.find_field(name, case_sensitive=True)
        except ValueError:
            return False
        return True

    def walk(name: str, t: pa.DataType) -> None:
        if not has(name):
            out.append(name)
            return
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(f"{name}.{t.field(i).name}", t.field(i).type)
        elif pa.types.is_map(t):
            walk(f"{name}.key", t.key_type)
            walk(f"{name}.value", t.item_type)
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            walk(f"{name}.element", t.value_type)

    for f in arrow:
        walk(f.name, f.type)
    return out


# --- schema evolution ----------------------------------------------------------------------


def evolve_schema(
    catalog: Catalog,
    identifier: tuple[str, str],
    schema: pa.Schema,
    attempts: int | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
) -> Table:
    """Make the table's schema hold every column (and nested field) of `schema`
    (`union_by_name`), in a catalog commit of that schema change alone: no snapshot, no
    property. Nothing is committed when the table already covers `schema`
    (tabletopic.commit.covers). The commit requires the table UUID, the current schema id and
    the last assigned column id it was built on; when another commit changed them first
    (CommitFailedException) the table is reloaded and the change rebuilt, at most `attempts`
    times (default: as many as COMMIT_RETRY, with its backoff; `on_retry` is told of each
    conflict). Returns the table as loaded after.

    This keeps floe's exactly-once argument (tabletopic.commit) whole. The argument rests on
    two things only floe commits change: the current snapshot id of `main` and `floe.offsets`;
    a schema-only commit changes neither, so whatever a floe commit checked of them still
    holds. A floe commit built on the schema before this one (a coordinator's, or the
    single-broker writer's) carries AssertCurrentSchemaId of the old schema id, so if this
    commit lands first that one fails its requirement instead of landing on a schema it did
    not read, and commit_offsets' retry reloads the table, finds `floe.offsets` unchanged and
    rebuilds it on the new schema (data files keep their column ids, which the new schema
    keeps). Conversely a floe commit landing first changes neither requirement of this one
    unless it evolved the schema itself, and then this one is rebuilt on top of it (or found
    unnecessary). The last assigned column id requirement makes sure two evolutions racing
    never hand out the same column ids."""

    def attempt() -> Table:
        table = catalog.load_table(identifier)
        if covers(table, schema):
            return table
        meta = table.metadata
        tx = table.transaction()
        with tx.update_schema() as update:
            update.union_by_name(schema)
        updates: tuple[TableUpdate, ...] = tx._updates
        others = sorted({type(u).__name__ for u in updates
                         if not isinstance(u, AddSchemaUpdate | SetCurrentSchemaUpdate)})
        if others:
            raise UnexpectedUpdates("a schema union staged other updates: " + ", ".join(others))
        if not updates:
            return table  # nothing to add (covers() compares types more strictly)
        requirements: tuple[TableRequirement, ...] = (
            AssertTableUUID(uuid=meta.table_uuid),
            AssertCurrentSchemaId.model_validate({"current-schema-id": meta.current_schema_id}),
            AssertLastAssignedFieldId.model_validate(
                {"last-assigned-field-id": meta.last_column_id}
            ),
        )
        catalog.commit_table(table, requirements, updates)
        return catalog.load_table(identifier)

    policy = COMMIT_RETRY if attempts is None else replace(COMMIT_RETRY, max_attempts=attempts)
    name = ".".join(identifier)
    return policy.run(attempt, f"table {name}: schema evolution", on_retry=on_retry, logger=log)


# --- staging -------------------------------------------------------------------------------


def append_files(
    tx: Transaction, files: list[DataFile], snapshot_properties: dict[str, str]
) -> None:
    """Stage, in `tx`, a fast append of `files` (a snapshot with no files when the list is
    empty) whose summary carries `snapshot_properties`. Raises ValueError for a delete file,
    and for a file written in another partition spec than the table's current one (pyiceberg
    would list it under the current spec's partition layout): such rows must be written
    again."""
    spec = tx.table_metadata.spec()
    for f in files:
        if f.content != DataFileContent.DATA:
            raise ValueError(f"{f.file_path}: not a data file ({f.content!r})")
        spec_id = getattr(f, "_spec_id", None)
        if spec_id != spec.spec_id or len(f.partition) != len(spec.fields):
            raise ValueError(
                f"{f.file_path}: written in partition spec {spec_id}, the table's is "
                f"{spec.spec_id}: write the rows again"
            )
    with tx.update_snapshot(snapshot_properties=snapshot_properties).fast_append() as append:
        for f in files:
            append.append_data_file(f)


# --- encoding ------------------------------------------------------------------------------


def encode(files: list[DataFile]) -> str:
    """The JSON text of `files`: {"format": 1, "files": [...]}, every DataFile field, binary
    values in base64, partition values tagged with their type (see `_encode_value`)."""
    return json.dumps(
        {"format": FORMAT, "files": [_encode_file(f) for f in files]},
        separators=(",", ":"), allow_nan=False,
    )


def _encode_file(f: DataFile) -> dict[str, Any]:
    spec_id = getattr(f, "_spec_id", None)
    if spec_id is None:
        raise ValueError(f"{f.file_path}: the DataFile has no spec_id")
    out: dict[str, Any] = {
        "content": int(f.content),
        "file_path": f.file_path,
        "file_format": FileFormat(f.file_format).name,
        "spec_id": spec_id,
        "partition": [_encode_value(f.partition[i]) for i in range(len(f.partition))],
        "record_count": f.record_count,
        "file_size_in_bytes": f.file_size_in_bytes,
        "key_metadata": _b64(f.key_metadata) if f.key_metadata is not None else None,
        "split_offsets": list(f.split_offsets) if f.split_offsets is not None else None,
        "equality_ids": list(f.equality_ids) if f.equality_ids is not None else None,
        "sort_order_id": f.sort_order_id,
    }
    for name in _COUNTS:
        counts: dict[int, int] | None = getattr(f, name)
        out[name] = None if counts is None else {str(k): v for k, v in counts.items()}
    for name in _BOUNDS:
        bounds: dict[int, bytes] | None = getattr(f, name)
        out[name] = None if bounds is None else {str(k): _b64(v) for k, v in bounds.items()}
    return out


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _encode_value(v: Any) -> dict[str, Any] | None:
    """A partition value as {"type": t, "value": ...}: bool, int, float (hex: exact, NaN and
    infinities included), str, bytes (base64), decimal (text), uuid (text); None as null."""
    if v is None:
        return None
    if isinstance(v, bool):
        return {"type": "bool", "value": v}
    if isinstance(v, int):
        return {"type": "int", "value": v}
    if isinstance(v, float):
        return {"type": "float", "value": v.hex()}
    if isinstance(v, str):
        return {"type": "str", "value": v}
    if isinstance(v, bytes):
        return {"type": "bytes", "value": _b64(v)}
    if isinstance(v, Decimal):
        return {"type": "decimal", "value": str(v)}
    if isinstance(v, uuid.UUID):
        return {"type": "uuid", "value": str(v)}
    raise ValueError(f"a partition value of type {type(v).__name__} cannot be encoded: {v!r}")


# --- decoding ------------------------------------------------------------------------------


def decode(text: str) -> list[DataFile]:
    """The DataFiles of `encode`'s text, built with DataFile.from_args as pyiceberg's writer
    builds them, `spec_id` set. Raises ValueError, naming the place, for anything that is not
    such a text: not JSON, another format version, a missing, unknown or mistyped field, a
    number out of its Iceberg range, bad base64."""
    if not isinstance(text, str):
        raise ValueError(f"data files: expected JSON text, got {type(text).__name__}")
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError as e:
        raise ValueError("data files: JSON nested too deeply") from e
    except ValueError as e:
        raise ValueError(f"data files: not valid JSON: {e}") from e
    top = _object(doc, "data files", required={"format", "files"})
    if top["format"] != FORMAT or isinstance(top["format"], bool):
        raise ValueError(f"data files: unknown format {top['format']!r} (this broker reads "
                         f"{FORMAT})")
    files = top["files"]
    if not isinstance(files, list):
        raise ValueError("data files: `files` is not a list")
    return [_decode_file(f, f"files[{i}]") for i, f in enumerate(files)]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _object(v: Any, where: str, required: set[str]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(v)}")
    if missing := required - v.keys():
        raise ValueError(f"{where}: missing {', '.join(sorted(missing))}")
    if unknown := v.keys() - required:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    return v


def _kind(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _int(v: Any, where: str, bounds: tuple[int, int] = _INT64) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{where}: expected an integer, got {_kind(v)}")
    if not bounds[0] <= v <= bounds[1]:
        raise ValueError(f"{where}: {v} out of range")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{where}: expected a string, got {_kind(v)}")
    return v


def _bytes(v: Any, where: str) -> bytes:
    text = _str(v, where)
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, ValueError) as e:  # binascii.Error is a ValueError
        raise ValueError(f"{where}: not base64") from e


def _int_map(v: Any, where: str, value: Callable[[Any, str], Any]) -> dict[int, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(v)}")
    out: dict[int, Any] = {}
    for k, x in v.items():
        if not re.fullmatch(r"-?[0-9]{1,10}", k):
            raise ValueError(f"{where}: key {k!r} is not a column id")
        out[_int(int(k), f"{where}: key", _INT32)] = value(x, f"{where}[{k}]")
    return out


def _int_list(v: Any, where: str, bounds: tuple[int, int]) -> list[int] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise ValueError(f"{where}: expected a list, got {_kind(v)}")
    return [_int(x, f"{where}[{i}]", bounds) for i, x in enumerate(v)]


def _decode_value(v: Any, where: str) -> Any:
    if v is None:
        return None
    tv = _object(v, where, required={"type", "value"})
    t, x = tv["type"], tv["value"]
    if t == "bool":
        if not isinstance(x, bool):
            raise ValueError(f"{where}: expected a boolean, got {_kind(x)}")
        return x
    if t == "int":
        return _int(x, where)
    if t == "float":
        try:
            return float.fromhex(_str(x, where))
        except (ValueError, OverflowError) as e:
            raise ValueError(f"{where}: not a hexadecimal float: {x!r}") from e
    if t == "str":
        return _str(x, where)
    if t == "bytes":
        return _bytes(x, where)
    if t == "decimal":
        try:
            d = Decimal(_str(x, where))
        except InvalidOperation as e:
            raise ValueError(f"{where}: not a decimal: {x!r}") from e
        if not d.is_finite():
            raise ValueError(f"{where}: not a finite decimal: {x!r}")
        return d
    if t == "uuid":
        try:
            return uuid.UUID(_str(x, where))
        except ValueError as e:
            raise ValueError(f"{where}: not a UUID: {x!r}") from e
    raise ValueError(f"{where}: unknown partition value type {t!r}")


def _decode_file(v: Any, where: str) -> DataFile:
    f = _object(v, where, required={*_FIELDS, "spec_id"})
    content = _int(f["content"], f"{where}.content")
    if content not in {c.value for c in DataFileContent}:
        raise ValueError(f"{where}.content: unknown content {content}")
    fmt = _str(f["file_format"], f"{where}.file_format")
    if fmt not in FileFormat.__members__:
        raise ValueError(f"{where}.file_format: unknown format {fmt!r}")
    partition = f["partition"]
    if not isinstance(partition, list):
        raise ValueError(f"{where}.partition: expected a list, got {_kind(partition)}")
    path = _str(f["file_path"], f"{where}.file_path")
    if not path:
        raise ValueError(f"{where}.file_path: empty")
    record_count = _int(f["record_count"], f"{where}.record_count")
    size = _int(f["file_size_in_bytes"], f"{where}.file_size_in_bytes")
    if record_count < 0 or size < 0:
        raise ValueError(f"{where}: negative record count or size")
    sort_order_id = f["sort_order_id"]
    key_metadata = f["key_metadata"]
    spec_id = _int(f["spec_id"], f"{where}.spec_id", (0, _INT32[1]))
    stats: dict[str, Any] = {name: _int_map(f[name], f"{where}.{name}", _int) for name in _COUNTS}
    stats |= {name: _int_map(f[name], f"{where}.{name}", _bytes) for name in _BOUNDS}
    out = DataFile.from_args(
        content=DataFileContent(content),
        file_path=path,
        file_format=FileFormat[fmt],
        partition=Record(*[_decode_value(x, f"{where}.partition[{i}]")
                           for i, x in enumerate(partition)]),
        record_count=record_count,
        file_size_in_bytes=size,
        **stats,
        key_metadata=None if key_metadata is None else _bytes(key_metadata,
                                                              f"{where}.key_metadata"),
        split_offsets=_int_list(f["split_offsets"], f"{where}.split_offsets", _INT64),
        equality_ids=_int_list(f["equality_ids"], f"{where}.equality_ids", _INT32),
        sort_order_id=None if sort_order_id is None else _int(sort_order_id,
                                                              f"{where}.sort_order_id", _INT32),
    )
    out.spec_id = spec_id
    return out


__all__ = [
    "MissingColumns", "append_files", "decode", "encode", "evolve_schema", "write_data_files",
]
