"""Records to Arrow: the `_kafka` struct plus value columns (raw bytes, a string, or JSON
objects whose top-level fields become columns with inferred, evolving types).

JSON typing: booleans -> boolean, integers -> long, other numbers -> double, strings -> string,
objects -> struct, arrays -> list. A field seen for the first time adds a column (or a nested
field); an integer where a double column exists is widened (if a double holds it exactly:
up to 2**53 in magnitude); any other mismatch (a string where a long column exists, a larger
integer in a double column, ...) makes that record invalid: it goes to the dead-letter topic,
the others go on. Null, [] and {} carry no type: they never create a column on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, cast

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from broker.protocol.recordcodec import Record
from broker.protocol.records import BatchHeader, CorruptBatchError
from tabletopic import _batchjson
from tabletopic.columnar import Columns, Headers, Parts, batch_bodies

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
KAFKA_TYPE = pa.struct(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("headers", pa.list_(HEADER_TYPE)),
    ]
)
KAFKA_FIELD = pa.field("_kafka", KAFKA_TYPE, nullable=False)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Conflict(ValueError):
    pass


@dataclass(frozen=True)
class Invalid:
    record: Record
    reason: str


def infer(v: Any) -> pa.DataType | None:
    """The Arrow type of one JSON value (None: no type information)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return pa.bool_()
    if isinstance(v, int):
        if not INT64_MIN <= v <= INT64_MAX:
            raise Conflict(f"integer {v} does not fit a long")
        return pa.int64()
    if isinstance(v, float):
        return pa.float64()
    if isinstance(v, str):
        return pa.string()
    if isinstance(v, list):
        elem: pa.DataType | None = None
        for item in v:
            elem = unify(elem, infer(item))
        return None if elem is None else pa.list_(elem)
    if isinstance(v, dict):
        fields: dict[str, pa.DataType] = {}
        for k, item in v.items():
            t = infer(item)
            if t is not None:
                fields[k] = t
        return pa.struct([pa.field(k, t) for k, t in fields.items()]) if fields else None
    raise Conflict(f"unsupported JSON value {type(v).__name__}")


def unify(known: pa.DataType | None, new: pa.DataType | None) -> pa.DataType | None:
    """The type that holds both, or Conflict."""
    if new is None or known == new:
        return known
    if known is None:
        return new
    if pa.types.is_float64(known) and pa.types.is_int64(new):
        return known
    if pa.types.is_struct(known) and pa.types.is_struct(new):
        fields = {f.name: f.type for f in known}
        for f in new:
            fields[f.name] = unify(fields.get(f.name), f.type)
        return pa.struct([pa.field(k, t) for k, t in fields.items()])
    if pa.types.is_list(known) and pa.types.is_list(new):
        return pa.list_(unify(known.value_type, new.value_type))
    raise Conflict(f"{new} where the column is {known}")


EXACT_DOUBLE = 2**53  # the largest magnitude of an integer every double holds exactly


def inexact(v: Any, t: pa.DataType | None) -> int | None:
    """An integer of the JSON value `v` (nested too) that type `t` keeps as a double and no
    double holds exactly (Arrow refuses to round it), or None."""
    if t is None or v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if pa.types.is_float64(t) and not -EXACT_DOUBLE <= v <= EXACT_DOUBLE else None
    if isinstance(v, list) and pa.types.is_list(t):
        return next((b for item in v if (b := inexact(item, t.value_type)) is not None), None)
    if isinstance(v, dict) and pa.types.is_struct(t):
        return next((b for f in t if (b := inexact(v.get(f.name), f.type)) is not None), None)
    return None


def kafka_column(partition: int, records: list[Record] | Columns) -> pa.StructArray:
    """The `_kafka` struct column, built from flat child arrays (no per-record dicts)."""
    cols = records if isinstance(records, Columns) else Columns.of(records)
    n = len(cols)
    return _kafka_struct(partition, n, pa.array(cols.offsets, pa.int64()),
                         pa.array(cols.timestamps, pa.int64()), pa.array(cols.keys, pa.binary()),
                         _headers(cols.headers, n))


def _kafka_struct(partition: int, n: int, offsets: pa.Array, timestamps_ms: pa.Array,
                  keys: pa.Array, headers: pa.Array) -> pa.StructArray:
    return pa.StructArray.from_arrays(
        [
            _repeat(partition, n, pa.int32()),
            offsets,
            # ms -> us in Arrow; a timestamp whose us overflow 64 bits raises, as pa.array did
            pc.multiply_checked(timestamps_ms, 1000).cast(pa.timestamp("us", tz="UTC")),
            keys,
            headers,
        ],
        fields=list(KAFKA_TYPE),
    )


def _headers(all_headers: list[Headers], n: int) -> pa.Array:
    """The headers of n records (`all_headers`: each record's; empty: none has any)."""
    if any(all_headers):
        header_offsets = [0]
        header_keys: list[str] = []
        header_values: list[bytes | None] = []
        for hs in all_headers:
            for k, v in hs:
                header_keys.append(k)
                header_values.append(v)
            header_offsets.append(len(header_keys))
        offsets = pa.array(header_offsets, pa.int32())
    else:  # no record has headers (the usual case): every list empty
        offsets, header_keys, header_values = _repeat(0, n + 1, pa.int32()), [], []
    return _header_lists(offsets, pa.array(header_keys, pa.string()),
                         pa.array(header_values, pa.binary()))


def _header_lists(offsets: pa.Array, keys: pa.Array, values: pa.Array) -> pa.Array:
    """Each record's headers, a list of (key, value) structs: record i's are keys and values
    offsets[i] to offsets[i + 1]."""
    return pa.ListArray.from_arrays(
        offsets, pa.StructArray.from_arrays([keys, values], fields=list(HEADER_TYPE)))


def _from_buffers(t: pa.DataType, n: int, validity: _batchjson.Block | None, nulls: int,
                  *buffers: _batchjson.Block) -> pa.Array:
    return pa.Array.from_buffers(
        t, n, [None if validity is None else pa.py_buffer(validity),
               *(pa.py_buffer(b) for b in buffers)], null_count=nulls)


def _repeat(value: int, n: int, t: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, t), n)


def align(array: pa.Array, t: pa.DataType) -> pa.Array:
    """`array` (as pa.array inferred it from decoded JSON) as type `t`, a type `unify` made of
    its normalized type and the known one: what pa.array(values, type=t) gives for the same
    values. Struct fields are taken by name (missing ones: nulls, others dropped), lists
    element-wise, a long cast to a double, a null array is all nulls."""
    if array.type == t:
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), t)
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(t) and pa.types.is_struct(array.type):
        names = {f.name for f in array.type}
        children = [align(array.field(f.name), f.type) if f.name in names
                    else pa.nulls(len(array), f.type) for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_list(t) and pa.types.is_list(array.type):
        values = align(array.values, t.value_type)
        return pa.ListArray.from_arrays(array.offsets, values, type=t, mask=mask)
    return array.cast(t)


def plain(t: pa.DataType) -> pa.DataType:
    """Arrow types as this module builds them (a table's schema read back through pyiceberg
    may use large_string / large_binary / large_list)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(plain(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, plain(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(plain(t.key_type), plain(t.item_type))
    if pa.types.is_timestamp(t) and t.unit == "us":
        return pa.timestamp("us", tz=t.tz)
    return t


def normalize(t: pa.DataType) -> pa.DataType | None:
    """Drop what carries no type (null columns, empty structs and lists of nulls)."""
    if pa.types.is_null(t):
        return None
    if pa.types.is_struct(t):
        fields = [(f.name, normalize(f.type)) for f in t]
        kept = [pa.field(n, ft) for n, ft in fields if ft is not None]
        return pa.struct(kept) if kept else None
    if pa.types.is_list(t):
        elem = normalize(t.value_type)
        return None if elem is None else pa.list_(elem)
    return t


# what msgspec raises for a value that is not JSON (a string not UTF-8: UnicodeDecodeError)
_NOT_JSON = (msgspec.DecodeError, UnicodeDecodeError)
RowDecoder = tuple[Callable[[bytes], Any], Any]
# the kinds of columns tabletopic._batchjson fills
_NATIVE_KINDS = {pa.int64(): 0, pa.float64(): 1, pa.string(): 2, pa.bool_(): 3}
_FLAT: dict[pa.DataType, Any] = {
    pa.int64(): int | None,
    pa.float64(): int | float | None,
    pa.string(): str | None,
    pa.bool_(): bool | None,
}


def _row_decoder(fields: dict[str, pa.DataType]) -> RowDecoder | None:
    """A msgspec decoder of JSON objects holding only these (flat) columns, each field of its
    column's type or null, and the row of a tombstone (all null); None if a column is of
    another type."""
    if not all(t in _FLAT for t in fields.values()):
        return None
    row = msgspec.defstruct(
        "Row", [(f"f{i}", _FLAT[t], None) for i, t in enumerate(fields.values())],
        rename={f"f{i}": k for i, k in enumerate(fields)}, forbid_unknown_fields=True)
    return msgspec.json.Decoder(row).decode, row()


class Converter:
    def __init__(self, value_type: str, known: pa.Schema | None = None) -> None:
        self.value_type = value_type
        self.fields: dict[str, pa.DataType] = {}
        self._typed: tuple[tuple[tuple[str, pa.DataType], ...], RowDecoder | None] | None = None
        if value_type == "json" and known is not None:
            self.fields = {f.name: plain(f.type) for f in known if f.name != "_kafka"}

    def schema(self) -> pa.Schema:
        if self.value_type == "raw":
            return pa.schema([KAFKA_FIELD, pa.field("value", pa.binary())])
        if self.value_type == "string":
            return pa.schema([KAFKA_FIELD, pa.field("value", pa.string())])
        return pa.schema([KAFKA_FIELD, *(pa.field(k, t) for k, t in self.fields.items())])

    def convert(
        self, partition: int, records: list[Record]
    ) -> tuple[pa.Table | None, list[Invalid]]:
        """The valid records as one Arrow table (None if there are none) and the invalid ones."""
        return self.convert_columns(partition, Columns.of(records))

    def convert_columns(
        self, partition: int, cols: Columns
    ) -> tuple[pa.Table | None, list[Invalid]]:
        """`convert` of records given as columns (tabletopic.columnar)."""
        invalid: list[Invalid] = []
        good: list[int] | None = None  # the rows of the valid records (None: every row)
        arrays: dict[str, pa.Array] | None = None
        if self.value_type == "raw":
            columns: dict[str, list[Any]] = {"value": cols.values}
        elif self.value_type == "string":
            good, values = [], []
            for i, v in enumerate(cols.values):
                try:
                    values.append(None if v is None else v.decode("utf-8"))
                    good.append(i)
                except UnicodeDecodeError as e:
                    invalid.append(Invalid(cols.record(i), f"value is not UTF-8: {e}"))
            columns = {"value": values}
        elif (typed := self._json_typed(cols)) is not None:
            arrays = typed
            columns = {}
        else:
            fast = self._json_fast(cols, invalid)
            if fast is not None:
                good, arrays = fast
                columns = {}
            else:
                invalid.clear()
                good, rows = self._json_rows_slow(cols, invalid)
                columns = {k: [row.get(k) for row in rows] for k in self.fields}
        kept = cols if good is None else cols.take(good)
        if not len(kept):
            return None, invalid
        kafka = kafka_column(partition, kept)
        schema = self.schema()
        if arrays is not None:
            out = [kafka, *(arrays[f.name] for f in list(schema)[1:])]
        else:
            out = [kafka] + [pa.array(columns[f.name], type=f.type) for f in list(schema)[1:]]
        return pa.Table.from_arrays(out, schema=schema), invalid

    def convert_batches(self, partition: int, data: bytes | Parts, batches: list[BatchHeader],
                        offset: int) -> pa.Table | None:
        """The table `convert_columns(partition, decode_columns(data, batches, offset))`
        gives, when every record at or after `offset` has header keys in UTF-8 and a value
        that is null or a JSON object of the table's columns, all longs, doubles, strings and
        booleans (what `_json_typed` takes, and no more: tabletopic/_batchjson.c), read in C
        without the GIL; None otherwise (then that path decides: rows, dead letters, new
        columns, a corrupt batch). tests/unit/test_batchjson.py compares the two."""
        if self.value_type != "json" or not self.fields \
                or not all(t in _NATIVE_KINDS for t in self.fields.values()):
            return None
        try:
            bodies = batch_bodies(data, batches)
        except CorruptBatchError:
            return None
        names = tuple(k.encode() for k in self.fields)
        kinds = tuple(_NATIVE_KINDS[t] for t in self.fields.values())
        out = _batchjson.decode(bodies, offset, names, kinds)
        if out is None or out[0] == 0:
            return None
        n, offsets, timestamps, key_valid, key_nulls, key_offsets, key_data, hdrs, columns = out
        if hdrs is None:  # no record has headers
            headers = _headers([], n)
        else:
            m, firsts, hkey_offsets, hkeys, hvalue_valid, hvalue_nulls, hvalue_offsets, \
                hvalues = hdrs
            headers = _header_lists(
                _from_buffers(pa.int32(), n + 1, None, 0, firsts),
                _from_buffers(pa.string(), m, None, 0, hkey_offsets, hkeys),
                _from_buffers(pa.binary(), m, hvalue_valid, hvalue_nulls, hvalue_offsets,
                              hvalues))
        try:
            kafka = _kafka_struct(
                partition, n, _from_buffers(pa.int64(), n, None, 0, offsets),
                _from_buffers(pa.int64(), n, None, 0, timestamps),
                _from_buffers(pa.binary(), n, key_valid, key_nulls, key_offsets, key_data),
                headers)
        except pa.ArrowInvalid:  # a timestamp whose us overflow: that path isolates it
            return None
        arrays = [_from_buffers(t, n, *column)
                  for t, column in zip(self.fields.values(), columns, strict=True)]
        return pa.Table.from_arrays([kafka, *arrays], schema=self.schema())

    def _json_typed(self, cols: Columns) -> dict[str, pa.Array] | None:
        """Fastest path, when the table's columns are all longs, doubles, strings and booleans
        (no struct or list): decode every value with msgspec into a Struct of exactly those
        columns (a JSON long is a long, a double an int or a float, ...; no other field)
        and build each column from a list. Whatever it cannot take (a new field, a value of
        another type, a record not JSON, ...) makes it give up (None): `_json_fast` and
        `_json_rows_slow` then do what they always did. When it succeeds, the values fit the
        columns as they are, so those paths would have given the same table and no change
        of type (tests/unit/test_columnar.py compares them)."""
        if not self.fields:
            return None
        key = tuple(self.fields.items())
        if self._typed is None or self._typed[0] != key:
            self._typed = (key, _row_decoder(self.fields))
        decoder = self._typed[1]
        if decoder is None:
            return None
        decode, empty = decoder
        values = cols.values
        try:  # without tombstones (the usual case) a plain map: no test per value
            rows = [empty if v is None else decode(v) for v in values] if None in values \
                else list(map(decode, cast(list[bytes], values)))
        except _NOT_JSON:  # ValidationError too
            return None
        try:
            return {k: pa.array(list(map(attrgetter(f"f{i}"), rows)), type=t)
                    for i, (k, t) in enumerate(self.fields.items())}
        except (pa.ArrowException, OverflowError):  # e.g. a long beyond 64 bits
            return None

    def _json_fast(
        self, cols: Columns, invalid: list[Invalid]
    ) -> tuple[list[int] | None, dict[str, pa.Array]] | None:
        """Fast path: decode every value, let Arrow infer the whole batch's types in C++ and
        unify them with the known columns once; the columns are the inferred arrays, aligned
        to the unified types (`align`). None if that fails (a value not an object, types clash
        inside the batch or with the table): then check record by record (the slow path)."""
        decode = msgspec.json.Decoder().decode
        values = cols.values
        good: list[int] | None = None
        try:
            rows = [{} if v is None else decode(v) for v in values]
        except _NOT_JSON:  # some are not JSON: each one says why
            good, rows = [], []
            for i, v in enumerate(values):
                if v is None:
                    good.append(i)
                    rows.append({})
                    continue
                try:
                    doc = decode(v)
                except _NOT_JSON as e:
                    invalid.append(Invalid(cols.record(i), f"invalid JSON record: {e}"))
                    continue
                good.append(i)
                rows.append(doc)
        if not all(type(doc) is dict for doc in rows) or any("_kafka" in doc for doc in rows):
            return None  # the slow path says why, record by record
        try:
            batch = pa.array(rows) if rows else None
            batch_type = normalize(batch.type) if batch is not None else None
            fields = dict(self.fields)
            for f in batch_type or ():
                fields[f.name] = unify(fields.get(f.name), f.type)
        except (pa.ArrowException, Conflict, OverflowError):
            return None
        known, self.fields = self.fields, {k: t for k, t in fields.items() if t is not None}
        n = len(rows)
        if isinstance(batch, pa.ChunkedArray):
            batch = batch.combine_chunks()
        names = {f.name for f in batch.type} if batch is not None else set()
        try:
            arrays = {k: align(batch.field(k), t) if batch is not None and k in names
                      else pa.nulls(n, t) for k, t in self.fields.items()}
        except pa.ArrowException:  # a long that a double column cannot hold exactly, ...
            self.fields = known
            return None
        return good, arrays

    def _json_rows_slow(
        self, cols: Columns, invalid: list[Invalid]
    ) -> tuple[list[int], list[dict[str, Any]]]:
        decoder = msgspec.json.Decoder()
        good: list[int] = []
        rows: list[dict[str, Any]] = []
        for i, value in enumerate(cols.values):
            if value is None:  # a tombstone: a row with no value columns
                good.append(i)
                rows.append({})
                continue
            try:
                doc = decoder.decode(value)
                if not isinstance(doc, dict):
                    raise Conflict(f"a JSON {type(doc).__name__}, not an object")
                if "_kafka" in doc:
                    raise Conflict("the field name _kafka is reserved")
                changes = {}
                for k, v in doc.items():
                    t = unify(self.fields.get(k), infer(v))
                    if t is not None and t != self.fields.get(k):
                        changes[k] = t
                    big = inexact(v, t)  # t: the column's type once this record is in
                    if big is not None:
                        raise Conflict(f"integer {big} of {k} is not exactly a double, the"
                                       " column's type")
            except (*_NOT_JSON, Conflict) as e:
                invalid.append(Invalid(cols.record(i), f"invalid JSON record: {e}"))
                continue
            self.fields.update(changes)
            good.append(i)
            rows.append(doc)
        return good, rows
