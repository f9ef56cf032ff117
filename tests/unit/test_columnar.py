"""tabletopic.columnar: records decoded into columns are exactly what decode_records gives,
and Converter on columns (its fast JSON path: inferred arrays aligned to the unified types)
gives exactly the tables and dead letters of the converter as it was before (a record by
record copy of it below, `OldConverter`)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from broker.protocol import records
from broker.protocol.recordcodec import Record, decode_records, encode_batch
from tabletopic.columnar import Columns, decode_columns
from tabletopic.convert import (
    HEADER_TYPE,
    KAFKA_TYPE,
    Conflict,
    Converter,
    Invalid,
    inexact,
    infer,
    kafka_column,
    normalize,
    plain,
    unify,
)
from tests.unit.test_records import compressed


# -- decoding ---------------------------------------------------------------------------------
def _batch(recs: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
           base: int, codec: int = 0, log_append: int | None = None) -> bytes:
    batch = bytearray(encode_batch(recs, timestamp_ms=1_700_000_000_123))
    if codec:
        batch = compressed(batch, codec)
    hs = records.validate(batch)
    records.assign_offsets(batch, hs, base, log_append)
    return bytes(batch)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_columns_are_what_decode_records_gives(codec: int) -> None:
    rnd = random.Random(codec)
    data, base = b"", 0
    for n in (1, 7, 130, 3):
        recs = []
        for i in range(n):
            key = None if i % 5 == 0 else bytes(rnd.randrange(256) for _ in range(i % 9))
            value = None if i % 11 == 3 else b"v" * rnd.choice((0, 1, 63, 64, 200, 20_000))
            hdrs = [(f"h{j}\u00e9", None if j == 1 else b"x" * j) for j in range(i % 3)]
            recs.append((key, value, hdrs))
        data += _batch(recs, base, codec, log_append=99_000 if n == 7 else None)
        base += n
    hs = list(records.iter_headers(data))
    for offset in (0, 1, 8, 100, base - 1):
        want = [r for h in hs for r in decode_records(data, h) if r.offset >= offset]
        for compiled in (True, False):
            got = decode_columns(data, hs, offset, compiled)
            assert got.records() == want
            assert Columns.of(want) == got


def _with_body(batch: bytes, body: bytes) -> bytes:
    """`batch` (uncompressed) with another records section (length fixed, CRC not)."""
    out = bytearray(batch[: records.HEADER_SIZE] + body)
    out[8:12] = (len(out) - 12).to_bytes(4, "big")
    return bytes(out)


def _odd_batches() -> list[bytes]:
    """Batches aiokafka's parser refuses and the Python one decodes (or refuses) itself."""
    plain = _batch([(b"k", b"v1", [("hx", b"1")]), (None, b"v2", [])], 10)
    body = plain[records.HEADER_SIZE :]
    return [
        plain.replace(b"hx", b"h\xff"),  # a header key not UTF-8: decoded with U+FFFD
        _with_body(plain, body + b"\x00\x00"),  # bytes after the last record: ignored
        _with_body(plain, body[:-3]),  # the last record cut short: corrupt
        _with_body(plain, body[:1] + b"\x7f" + body[2:]),  # an attributes byte of 0x7f: kept
        _with_body(plain, body[:4] + b"\x00\x7e" + body[6:]),  # a key longer than its record
    ]


@pytest.mark.parametrize("case", range(5))
def test_batches_aiokafka_refuses_decode_as_decode_records_does(case: int) -> None:
    data = _odd_batches()[case]
    hs = list(records.iter_headers(data))
    try:
        want = [r for h in hs for r in decode_records(data, h)]
    except records.CorruptBatchError as e:
        with pytest.raises(records.CorruptBatchError, match=str(e)):
            decode_columns(data, hs, 0)
        return
    assert decode_columns(data, hs, 0).records() == want
    assert decode_columns(data, hs, 0, compiled=False).records() == want


def test_a_corrupt_batch_raises_as_decode_records_does() -> None:
    batch = bytearray(_batch([(b"k", b"value", [])], 0))
    cut = bytearray(batch)
    cut[records.HEADER_SIZE] = 0x7E  # the first record claims to be much longer
    (h,) = records.iter_headers(batch)
    with pytest.raises(records.CorruptBatchError):
        decode_records(bytes(cut), h)
    with pytest.raises(records.CorruptBatchError):
        decode_columns(bytes(cut), [h], 0)


# -- converting: the converter as it was (record by record), for reference ------------------
def _old_kafka_column(partition: int, recs: list[Record]) -> pa.StructArray:
    header_offsets = [0]
    header_keys: list[str] = []
    header_values: list[bytes | None] = []
    for r in recs:
        for k, v in r.headers:
            header_keys.append(k)
            header_values.append(v)
        header_offsets.append(len(header_keys))
    headers = pa.ListArray.from_arrays(
        pa.array(header_offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(header_keys, pa.string()), pa.array(header_values, pa.binary())],
            fields=list(HEADER_TYPE)))
    return pa.StructArray.from_arrays(
        [pa.array([partition] * len(recs), pa.int32()),
         pa.array([r.offset for r in recs], pa.int64()),
         pa.array([r.timestamp * 1000 for r in recs], pa.timestamp("us", tz="UTC")),
         pa.array([r.key for r in recs], pa.binary()), headers],
        fields=list(KAFKA_TYPE))


@pytest.mark.parametrize("headers", [False, True])
def test_the_kafka_column_is_the_record_by_record_one(headers: bool) -> None:
    """kafka_column (partition and empty header lists repeated in Arrow, ms -> us multiplied
    there) gives what the record-by-record column gives: timestamps -1 (none), 0 and now,
    keys and none, headers on some records or on none."""
    hs: tuple[tuple[str, bytes | None], ...] = (("h", b"v"), ("n", None)) if headers else ()
    recs = [Record(10 + i, ts, key, b"{}", hs if i % 2 else ())
            for i, (ts, key) in enumerate([(-1, None), (0, b"k"), (1_700_000_000_123, b"")])]
    for partition in (0, 7):
        assert kafka_column(partition, recs).equals(_old_kafka_column(partition, recs))
    assert kafka_column(3, []).equals(_old_kafka_column(3, []))


def test_a_timestamp_beyond_64_bits_of_microseconds_raises() -> None:
    """As pa.array did: the record's conversion raises (the writer then isolates it as a
    dead letter, tabletopic.writer.convert_isolating), its microseconds never wrap around."""
    rec = Record(0, 2**62, None, b"{}", ())
    with pytest.raises((pa.ArrowInvalid, OverflowError)):
        _old_kafka_column(0, [rec])
    with pytest.raises(pa.ArrowInvalid):
        kafka_column(0, [rec])


class OldConverter(Converter):
    """tabletopic.convert.Converter.convert for JSON values before the columnar path (and two
    fixes since: a string not UTF-8, and an integer that a double column cannot hold exactly,
    make their record invalid; both raised out of convert, stalling the table)."""

    def convert(self, partition: int, recs: list[Record]
                ) -> tuple[pa.Table | None, list[Invalid]]:
        invalid: list[Invalid] = []
        good, rows = self._rows(recs, invalid)
        columns = {k: [row.get(k) for row in rows] for k in self.fields}
        if not good:
            return None, invalid
        schema = self.schema()
        arrays = [_old_kafka_column(partition, good)] + [
            pa.array(columns[f.name], type=f.type) for f in list(schema)[1:]]
        return pa.Table.from_arrays(arrays, schema=schema), invalid

    def _rows(self, recs: list[Record], invalid: list[Invalid]
              ) -> tuple[list[Record], list[dict[str, Any]]]:
        decoder = msgspec.json.Decoder()
        good: list[Record] = []
        rows: list[dict[str, Any]] = []
        for r in recs:
            if r.value is None:
                good.append(r)
                rows.append({})
                continue
            try:
                doc = decoder.decode(r.value)
            except (msgspec.DecodeError, UnicodeDecodeError) as e:
                invalid.append(Invalid(r, f"invalid JSON record: {e}"))
                continue
            if not isinstance(doc, dict) or "_kafka" in doc:
                invalid.clear()
                return self._slow(recs, invalid)
            good.append(r)
            rows.append(doc)
        try:
            batch_type = normalize(pa.array(rows).type) if rows else None
            fields = dict(self.fields)
            for f in batch_type or ():
                fields[f.name] = unify(fields.get(f.name), f.type)
        except (pa.ArrowException, Conflict, OverflowError):
            invalid.clear()
            return self._slow(recs, invalid)
        if any(inexact(v, fields.get(k)) is not None for row in rows for k, v in row.items()):
            invalid.clear()
            return self._slow(recs, invalid)
        self.fields = {k: t for k, t in fields.items() if t is not None}
        return good, rows

    def _slow(self, recs: list[Record], invalid: list[Invalid]
              ) -> tuple[list[Record], list[dict[str, Any]]]:
        decoder = msgspec.json.Decoder()
        good: list[Record] = []
        rows: list[dict[str, Any]] = []
        for r in recs:
            if r.value is None:
                good.append(r)
                rows.append({})
                continue
            try:
                doc = decoder.decode(r.value)
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
            except (msgspec.DecodeError, UnicodeDecodeError, Conflict) as e:
                invalid.append(Invalid(r, f"invalid JSON record: {e}"))
                continue
            self.fields.update(changes)
            good.append(r)
            rows.append(doc)
        return good, rows


def _value(rnd: random.Random, i: int, bad: float) -> bytes | None:
    if rnd.random() < 0.05:
        return None
    if rnd.random() < bad:
        return rnd.choice([b"{oops", b"", b"[1, 2]", b"3", json.dumps({"_kafka": 1}).encode(),
                           json.dumps({"id": "one"}).encode(), b'{"id": 1}{"id": 2}',
                           json.dumps({"amount": [1]}).encode(),
                           json.dumps({"nested": {"a": "x"}}).encode()])
    doc: dict[str, Any] = {"id": i}
    if rnd.random() < 0.8:
        doc["amount"] = rnd.choice([i * 0.25, i, None])
    if rnd.random() < 0.5:
        doc["user"] = rnd.choice([f"user-{i}", None, "\u00e9\n\"x"])
    if rnd.random() < 0.4:
        doc["nested"] = rnd.choice([
            None, {}, {"a": i}, {"a": i * 0.5, "b": [1, 2]}, {"b": [], "c": {"d": True}},
            {"c": {}}, {"c": None}, {"e": None}])
    if rnd.random() < 0.3:
        doc["tags"] = rnd.choice([[], [None], ["a", None], [{"x": 1}, {"y": 2.5}], None])
    if rnd.random() < 0.2:
        doc[f"new{i % 7}"] = rnd.choice([True, 1, 1.5, "s", {"z": 1}, [1]])
    if rnd.random() < 0.1:
        doc["empty"] = rnd.choice([{}, [], None])
    return json.dumps(doc).encode()


@pytest.mark.parametrize("seed", range(12))
def test_json_columns_give_what_the_record_converter_gave(seed: int) -> None:
    rnd = random.Random(seed)
    known = None
    if seed % 3 == 1:  # a table that exists: its columns, read back with large types
        known = pa.schema([pa.field("_kafka", KAFKA_TYPE), pa.field("amount", pa.float64()),
                           pa.field("user", pa.large_string()),
                           pa.field("tags", pa.large_list(pa.int64()))])
    new, old = Converter("json", known), OldConverter("json", known)
    offset = 0
    for batch in range(8):
        n = rnd.choice([1, 5, 40, 300])
        bad = rnd.choice([0.0, 0.0, 0.02, 0.3])
        recs = [Record(offset + i, 1_700_000_000_000 + i, rnd.choice([None, b"k"]),
                       _value(rnd, offset + i, bad),
                       rnd.choice([(), (("h", b"v"),), (("a", None), ("b", b""))]))
                for i in range(n)]
        offset += n
        want, want_bad = old.convert(3, recs)
        got, got_bad = new.convert_columns(3, Columns.of(recs))
        assert [(b.record, b.reason) for b in got_bad] == \
            [(b.record, b.reason) for b in want_bad], batch
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.schema == want.schema, (batch, got.schema, want.schema)
            assert got.equals(want), batch
            assert got.to_pylist() == want.to_pylist(), batch
        assert new.fields == old.fields
        assert new.schema() == old.schema()


def test_the_fast_path_aligns_nested_types_to_the_table() -> None:
    known = pa.schema([pa.field("_kafka", KAFKA_TYPE),
                       pa.field("s", pa.struct([pa.field("x", pa.float64()),
                                                pa.field("l", pa.large_list(pa.float64()))])),
                       pa.field("n", pa.float64())])
    c = Converter("json", known)
    recs = [Record(i, 0, None, json.dumps(d).encode(), ()) for i, d in enumerate(
        [{"s": {"l": [1, 2], "y": "a"}, "n": 1}, {"s": None, "n": None}, {"s": {}}, {},
         {"s": {"x": 2, "l": None}}])]
    table, bad = c.convert(0, recs)
    assert not bad and table is not None
    assert table.schema.field("s").type == pa.struct(
        [pa.field("x", pa.float64()), pa.field("l", pa.list_(pa.float64())),
         pa.field("y", pa.string())])
    assert table.column("n").to_pylist() == [1.0, None, None, None, None]
    assert table.column("s").to_pylist() == [
        {"x": None, "l": [1.0, 2.0], "y": "a"}, None, {"x": None, "l": None, "y": None}, None,
        {"x": 2.0, "l": None, "y": None}]
    assert plain(known.field("s").type) != table.schema.field("s").type  # evolved: y added


def _flat_value(rnd: random.Random, i: int, bad: float, nested: bool) -> bytes | None:
    if rnd.random() < 0.05:
        return None
    if rnd.random() < bad:
        return rnd.choice([
            b"{oops", b"", b"[1]", b"null", b'{"_kafka": 1}', b'{"id": "one"}', b'{"id": 1.0}',
            b'{"id": true}', b'{"ok": 1}', b'{"user": 5}', b'{"amount": "x"}',
            b'{"id": 123456789012345678901234567890}', b'{"id": 9223372036854775808}',
            b'{"amount": 123456789012345678901234567890}', b'{"id": 1} x',
            b'{"amount": 9007199254740993}', b'{"brand_new": 1}', b'{"id": 1, "id": "x"}',
            b'{"amount": NaN}', b'{"amount": -0}', b'{"user": "\xff"}', b'{"id": 1}{"id": 2}',
            b' {"id": 1}', b'{\n"id": 1}', b'{"user": "\\ud800"}',
            *([b'{"nested": {"a": 1}}', b'{"user": ["a"]}'] if nested else [])])
    doc: dict[str, Any] = {"id": rnd.choice([i, -i, None, 2**63 - 1, -(2**63)])}
    if rnd.random() < 0.9:
        doc["amount"] = rnd.choice([i * 0.25, i, None, -0.0, 1e300, 2**53])
    if rnd.random() < 0.7:
        doc["user"] = rnd.choice([f"user-{i}", None, "\u00e9\n\"x\u2028", ""])
    if rnd.random() < 0.5:
        doc["ok"] = rnd.choice([True, False, None])
    text = json.dumps(doc)
    if rnd.random() < 0.05:
        text = text.replace("{", '{"id": 7, ', 1)  # a duplicate key: the last one counts
    return text.encode()


@pytest.mark.parametrize("seed", range(10))
def test_flat_json_columns_give_what_the_record_converter_gave(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = []
    typed = Converter._json_typed

    def counting(self: Converter, cols: Columns) -> dict[str, pa.Array] | None:
        out = typed(self, cols)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(Converter, "_json_typed", counting)
    rnd = random.Random(seed)
    known = None
    if seed % 2:
        known = pa.schema([pa.field("_kafka", KAFKA_TYPE), pa.field("amount", pa.float64()),
                           pa.field("user", pa.large_string()), pa.field("ok", pa.bool_())])
    new, old = Converter("json", known), OldConverter("json", known)
    offset = 0
    for batch in range(12):
        n = rnd.choice([1, 5, 40, 300])
        bad = rnd.choice([0.0, 0.0, 0.0, 0.01, 0.2])
        recs = [Record(offset + i, 1_700_000_000_000 + i, rnd.choice([None, b"k"]),
                       _flat_value(rnd, offset + i, bad, seed == 0), ()) for i in range(n)]
        offset += n
        want, want_bad = old.convert(3, recs)  # a long beyond 2**53 into a double: invalid
        got, got_bad = new.convert_columns(3, Columns.of(recs))
        assert [(b.record, b.reason) for b in got_bad] == \
            [(b.record, b.reason) for b in want_bad], batch
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.schema == want.schema, (batch, got.schema, want.schema)
            assert got.equals(want), batch
            assert got.to_pylist() == want.to_pylist(), batch
        assert new.fields == old.fields
    assert any(taken) and not all(taken)  # both paths were taken


def test_the_compiled_parser_is_there() -> None:
    """The tested aiokafka range (pyproject) still has its compiled DefaultRecordBatch where
    tabletopic.columnar imports it: otherwise every batch silently takes the Python parser."""
    import sys

    from tabletopic import columnar

    assert columnar._CBatch is not None
    module = sys.modules[columnar._CBatch.__module__]
    assert str(module.__file__).endswith(".so"), module.__file__  # aiokafka's pure-Python twin


@pytest.mark.parametrize("n", [3, 600])  # record by record, and Arrow's bulk reader first
def test_a_string_not_utf8_makes_its_record_invalid(n: int) -> None:
    """It goes to the dead letters; it used to raise out of convert (the partition stalled)."""
    known = pa.schema([pa.field("_kafka", KAFKA_TYPE), pa.field("a", pa.string())])
    for conv in (Converter("json"), Converter("json", known)):
        recs = [Record(i, 0, None, b'{"a": "ok"}', ()) for i in range(n)]
        recs[1] = Record(1, 0, None, b'{"a": "\xff"}', ())
        table, bad = conv.convert(0, recs)
        assert [(b.record.offset, b.reason.split(":")[0]) for b in bad] == \
            [(1, "invalid JSON record")]
        assert table is not None and table.num_rows == n - 1
        assert table.column("a").to_pylist() == ["ok"] * (n - 1)


@pytest.mark.parametrize("known", [False, True])
def test_an_integer_a_double_column_cannot_hold_makes_its_record_invalid(known: bool) -> None:
    """It goes to the dead letters (the others go on); it used to raise out of convert, and
    the writer retried the same batch forever. Nested in a struct or a list too; 2**53 itself
    fits."""
    schema = pa.schema([pa.field("_kafka", KAFKA_TYPE), pa.field("x", pa.float64()),
                        pa.field("s", pa.struct([pa.field("y", pa.float64())])),
                        pa.field("l", pa.list_(pa.float64()))])
    values = [b'{"x": 1.5, "s": {"y": 0.5}, "l": [0.5]}', b'{"x": 9007199254740993}',
              b'{"x": -9007199254740992}', b'{"s": {"y": 18014398509481984}}',
              b'{"l": [1, 2, -9007199254740993]}', b'{"x": 3, "l": [4]}']
    conv = Converter("json", schema if known else None)
    table, bad = conv.convert(0, [Record(i, 0, None, v, ()) for i, v in enumerate(values)])
    assert [(b.record.offset, b.reason.split(":")[0]) for b in bad] == \
        [(1, "invalid JSON record"), (3, "invalid JSON record"), (4, "invalid JSON record")]
    assert "not exactly a double" in bad[0].reason
    assert table is not None
    assert table.column("_kafka").combine_chunks().field("offset").to_pylist() == [0, 2, 5]
    assert table.column("x").to_pylist() == [1.5, -9007199254740992.0, 3.0]
    assert table.column("l").to_pylist() == [[0.5], None, [4.0]]
    assert inexact(2**53, pa.float64()) is None and inexact(2**53 + 1, pa.int64()) is None
    assert inexact([2**53 + 1], pa.list_(pa.float64())) == 2**53 + 1
    only_ints = [Record(i, 0, None, v, ()) for i, v in
                 enumerate([b'{"x": 9007199254740993}', b'{"x": 1}'])]  # inferred as longs
    table, bad = Converter("json", schema).convert(0, only_ints)
    assert [b.record.offset for b in bad] == [0]
    assert table is not None and table.column("x").to_pylist() == [1.0]
