"""tabletopic._batchjson (C, without the GIL) through Converter.convert_batches: where it takes
a read, the table is exactly the one the Python path (decode_columns, then convert_columns)
builds, value for value and bit for bit; where the read holds anything that path treats
otherwise (a dead letter, a new column, a header, a corrupt batch, ...), it declines (None)
and the Python path decides as before. Hostile bytes never crash it: they are declined."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import struct
from typing import Any

import pyarrow as pa
import pytest

from broker.protocol import records
from broker.protocol.recordcodec import _field, _zigzag, encode_batch
from tabletopic import _batchjson
from tabletopic import convert as convert_module
from tabletopic.columnar import Parts, batch_bodies, decode_columns
from tabletopic.convert import KAFKA_TYPE, Converter
from tabletopic.writer import _convert_columns
from tests.unit.test_records import compressed

KNOWN = pa.schema([pa.field("_kafka", KAFKA_TYPE), pa.field("id", pa.int64()),
                   pa.field("user", pa.large_string()), pa.field("amount", pa.float64()),
                   pa.field("ok", pa.bool_()), pa.field("note", pa.string())])


Headers = list[tuple[str, bytes | None]]


def _batch(values: list[tuple[bytes | None, bytes | None]], base: int, codec: int = 0,
           log_append: int | None = None, ts_step: int = 0,
           headers: list[Headers] | None = None) -> bytes:
    """A v2 batch of (key, value) records at offsets from `base`; record i's timestamp is the
    batch's plus i * ts_step, its headers headers[i]."""
    hs = headers or [[] for _ in values]
    batch = bytearray(encode_batch([(k, v, h) for (k, v), h in zip(values, hs, strict=True)],
                                   timestamp_ms=1_700_000_000))
    if ts_step:
        body = bytearray()
        for i, ((k, v), h) in enumerate(zip(values, hs, strict=True)):
            rec = b"\x00" + _zigzag(i * ts_step) + _zigzag(i) + _field(k) + _field(v) \
                + _zigzag(len(h)) + b"".join(_field(hk.encode()) + _field(hv) for hk, hv in h)
            body += _zigzag(len(rec)) + rec
        batch = batch[: records.HEADER_SIZE] + body
        struct.pack_into(">i", batch, 8, len(batch) - records.LOG_OVERHEAD)
        struct.pack_into(">q", batch, 35, 1_700_000_000 + (len(values) - 1) * ts_step)
    if codec:
        batch = compressed(batch, codec)
    records.assign_offsets(batch, records.iter_headers(batch), base, log_append)
    return bytes(batch)


def _python(data: bytes, offset: int, known: pa.Schema = KNOWN) -> tuple[Any, list[Any]]:
    hs = list(records.iter_headers(data))
    return Converter("json", known).convert_columns(3, decode_columns(data, hs, offset))


def _native(data: bytes, offset: int, known: pa.Schema = KNOWN) -> pa.Table | None:
    return Converter("json", known).convert_batches(3, data, list(records.iter_headers(data)),
                                                    offset)


def _same(got: pa.Table, want: pa.Table) -> None:
    assert got.schema == want.schema
    assert got.equals(want)
    assert got.to_pylist() == want.to_pylist()
    for name in [f.name for f in got.schema if f.type == pa.float64()]:  # bit for bit (-0.0)
        assert [struct.pack("<d", x) if x is not None else None for x in got[name].to_pylist()] \
            == [struct.pack("<d", x) if x is not None else None for x in want[name].to_pylist()]
    got.validate(full=True)


def _number(rnd: random.Random) -> str:
    """A JSON number of any syntax: integers, fractions, exponents, many digits."""
    kind = rnd.randrange(6)
    if kind == 0:
        return str(rnd.randrange(-(2**53), 2**53 + 1))
    if kind == 1:
        return repr(rnd.uniform(-1e6, 1e6))
    if kind == 2:
        return repr(rnd.random() * 10.0 ** rnd.randrange(-300, 300))
    if kind == 3:
        return rnd.choice(["-0", "0", "-0.0", "0.0", "1E+2", "1e-7", "2.5E3", "123456789e-5"])
    digits = "".join(rnd.choice("0123456789") for _ in range(rnd.randrange(1, 30)))
    digits = digits.lstrip("0") or "0"
    frac = "".join(rnd.choice("0123456789") for _ in range(rnd.randrange(1, 25)))
    exp = f"e{rnd.randrange(-40, 40)}" if kind == 5 else ""
    return f"{rnd.choice(['', '-'])}{digits[:15]}.{frac}{exp}"


_STRINGS = ["", "user-1", "é\n\"x\u2028", "\u0000tab\there", "😀 emoji", "a/b\\c", "日本語",
            "x" * 300]


def _string(rnd: random.Random) -> str:
    s = rnd.choice(_STRINGS)
    text = json.dumps(s, ensure_ascii=rnd.random() < 0.5)  # \uXXXX escapes or raw UTF-8
    return text.replace("/", "\\/") if rnd.random() < 0.3 else text


def _value(rnd: random.Random, i: int) -> bytes | None:
    if rnd.random() < 0.05:
        return None  # a tombstone: a row of nulls
    fields = {"id": str(rnd.choice([i, -i, 0, 2**63 - 1, -(2**63)])),
              "user": _string(rnd), "amount": _number(rnd),
              "ok": rnd.choice(["true", "false"]), "note": _string(rnd)}
    names = [k for k in fields if rnd.random() < 0.8]
    rnd.shuffle(names)
    ws = rnd.choice(["", " ", "\n", "\t\r\n "])
    parts = [f'{ws}"{k}"{ws}:{ws}{"null" if rnd.random() < 0.1 else fields[k]}{ws}'
             for k in names]
    return f"{ws}{{{','.join(parts)}}}{ws}".encode()


def _headers(rnd: random.Random) -> Headers:
    return [(rnd.choice(["trace", "", "é\u0000ü", "😀"]), rnd.choice([None, b"", b"v\xff\x00"]))
            for _ in range(rnd.choice([0, 0, 1, 3]))]


@pytest.mark.parametrize("seed", range(8))  # odd seeds: no headers; even: some
def test_it_gives_the_python_paths_table(seed: int) -> None:
    rnd = random.Random(seed)
    data, base = b"", 0
    for b in range(6):
        n = rnd.choice([1, 3, 50, 400])
        values = [(rnd.choice([None, b"", b"key-%d" % i]), _value(rnd, base + i))
                  for i in range(n)]
        headers = None if seed % 2 else [_headers(rnd) for _ in range(n)]
        data += _batch(values, base, codec=rnd.choice([0, 0, 1, 2, 3, 4]),
                       log_append=1_800_000_000 if b == 2 else None,
                       ts_step=rnd.choice([0, 1, -3, 1000]), headers=headers)
        base += n
    for offset in (0, 1, base // 2, base - 1):
        want, bad = _python(data, offset)
        assert bad == []
        got = _native(data, offset)
        assert got is not None, offset
        _same(got, want)


def _short_decimal(rnd: random.Random) -> str:
    """Up to 15 digits and an exponent within 25: what the C path computes with one IEEE
    operation (Clinger's fast path) rather than strtod."""
    digits = str(rnd.randrange(1, 10 ** rnd.randrange(1, 16)))
    at = rnd.randrange(0, len(digits) + 1)
    text = (digits[:at] or "0") + ("." + digits[at:] if digits[at:] else "")
    if rnd.random() < 0.5:
        text += f"e{rnd.randrange(-25, 25)}"
    return rnd.choice(["", "-"]) + text


def test_floats_parse_as_msgspec_parses_them() -> None:
    """Correctly rounded, as msgspec (and Python) read them: 3,000 random decimal texts of
    any length and 20,000 short ones."""
    rnd = random.Random(7)
    texts = [_number(rnd) for _ in range(3000)] + [_short_decimal(rnd) for _ in range(20000)]
    texts = [t for t in texts if abs(float(t)) < 1e300 and (float(t) == 0 or
                                                            abs(float(t)) > 1e-300)]
    values = [(None, b'{"amount": %s}' % t.encode()) for t in texts]
    data = _batch(values, 0)
    want, bad = _python(data, 0)
    assert bad == []
    got = _native(data, 0)
    assert got is not None
    _same(got, want)


_DECLINED = [
    b'{"brand_new": 1}',  # a new column: the Python path adds it
    b'{"id": 1, "id": 2}',  # a key twice
    b'{"\\u0069d": 1}',  # an escaped key
    b'{"id": 1.0}', b'{"id": 1e2}',  # a double in a long column
    b'{"id": 9223372036854775808}', b'{"id": -9223372036854775809}',  # beyond a long
    b'{"id": 123456789012345678901234567890}',
    b'{"amount": 9007199254740993}',  # a long no double holds exactly
    b'{"amount": 1e400}', b'{"amount": 1e-400}',  # beyond a double; below its precision
    b'{"amount": NaN}', b'{"amount": .5}', b'{"amount": 1.}', b'{"amount": 01}',
    b'{"amount": -}', b'{"amount": "1"}', b'{"amount": true}',
    b'{"user": 5}', b'{"user": "\xff"}', b'{"user": "\xed\xa0\x80"}',  # not UTF-8
    b'{"user": "\\ud800"}', b'{"user": "\\udc00"}', b'{"user": "\\ud800\\u0041"}',
    b'{"user": "a\tb"}', b'{"user": "\\x"}', b'{"user": "open}',
    b'{"user": ["a"]}', b'{"user": {"a": 1}}',
    b'{"ok": 1}', b'{"ok": tru}', b'{"ok": truex}', b'{"ok": nul}',
    b'{"id": 1,}', b'{"id": 1} x', b'{"id": 1}{"id": 2}', b'{"id" 1}', b'{id: 1}',
    b"", b" ", b"null", b"[]", b"1", b'"s"', b"{", b"\xef\xbb\xbf{}",
    b'{"_kafka": 1}',
]


@pytest.mark.parametrize("value", _DECLINED)
def test_it_declines_what_the_python_path_treats_otherwise(value: bytes) -> None:
    good = [(b"k", b'{"id": %d}' % i) for i in range(5)]
    data = _batch([*good[:3], (b"k", value), *good[3:]], 0)
    assert _native(data, 0) is None
    _python(data, 0)  # and the Python path still takes the read (rows, dead letters)


def test_a_declined_record_below_the_offset_does_not_matter() -> None:
    data = _batch([(None, b"not json"), (None, b'{"id": 1}')], 0)
    assert _native(data, 0) is None
    got, (want, bad) = _native(data, 1), _python(data, 1)
    assert got is not None and bad == []
    _same(got, want)


def _declined_batches() -> list[bytes]:
    plain = _batch([(b"k", b'{"id": 1}'), (None, b'{"id": 2}')], 10)
    body = plain[records.HEADER_SIZE :]

    def with_body(new: bytes) -> bytes:
        out = bytearray(plain[: records.HEADER_SIZE] + new)
        out[8:12] = (len(out) - 12).to_bytes(4, "big")
        return bytes(out)

    bad_key = _batch([(b"k", b'{"id": 1}')], 0, headers=[[("HKEY", b"1")]])
    assert bad_key.count(b"HKEY") == 1
    return [
        bad_key.replace(b"HKEY", b"\xffKEY"),  # a header key not UTF-8 (read with U+FFFD)
        with_body(body + b"\x00\x00"),  # bytes after the last record
        with_body(body[:-3]),  # the last record cut short
        with_body(body[:1] + b"\x80" + body[2:]),  # an attributes byte with its top bit set
        with_body(body[:4] + b"\x00\x7e" + body[6:]),  # a key longer than its record
        with_body(b"\x02" + body[1:]),  # a record shorter than its fields
    ]


@pytest.mark.parametrize("case", range(6))
def test_it_declines_odd_and_corrupt_batches(case: int) -> None:
    assert _native(_declined_batches()[case], 0) is None


def test_hostile_bytes_are_declined_or_read_as_the_python_path_reads_them() -> None:
    """2,000 batches with random bytes of their records changed: each one is declined, or
    gives exactly the Python path's table (never a crash, never another table)."""
    rnd = random.Random(11)
    plain = _batch([(b"k%d" % i, _value(rnd, i)) for i in range(20)], 0,
                   headers=[_headers(rnd) for _ in range(20)])
    taken = 0
    for _ in range(2000):
        data = bytearray(plain)
        for _ in range(rnd.choice([1, 1, 2, 5])):
            at = rnd.randrange(records.HEADER_SIZE, len(data))
            data[at] = rnd.choice([rnd.randrange(256), data[at] ^ 1, 0x22, 0x5C, 0x7B, 0x7D])
        got = _native(bytes(data), 0)
        if got is None:
            continue
        want, bad = _python(bytes(data), 0)
        assert bad == []
        _same(got, want)
        taken += 1
    assert taken > 50


@pytest.mark.parametrize("seed", range(3))
def test_random_bodies_never_crash_the_decoder(seed: int) -> None:
    rnd = random.Random(seed)
    names, kinds = (b"id", b"user", b"amount", b"ok"), (0, 2, 1, 3)
    for _ in range(3000):
        body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 64)))
        out = _batchjson.decode([(body, rnd.randrange(-5, 5), 0, 0, False,
                                  rnd.randrange(-1, 40))], 0, names, kinds)
        assert out is None or out[0] >= 0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each call of the C decoder took its read (a spy around it)."""
    taken: list[bool] = []
    decode = _batchjson.decode

    def spy(*args: Any) -> Any:
        out = decode(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(convert_module._batchjson, "decode", spy)
    return taken


def test_the_writer_converts_with_it(calls: list[bool]) -> None:
    """The table writer's conversion of a read goes through it once the columns are known."""
    rnd = random.Random(3)
    data = _batch([(None, _value(rnd, i)) for i in range(100)], 0)
    hs = list(records.iter_headers(data))
    conv = Converter("json", KNOWN)
    table, dead, first = _convert_columns(conv, 3, data, hs, 0, False)
    assert calls == [True] and dead == [] and first is None
    want, _ = _python(data, 0)
    _same(table, want)


def test_bodies_are_the_batches_records_sections() -> None:
    data = _batch([(None, b"{}")], 0, codec=4) + _batch([(None, b"{}")], 1)
    hs = list(records.iter_headers(data))
    bodies = batch_bodies(data, hs)
    assert [bytes(b[0]) for b in bodies] == [
        records.decompress(h.compression, data[h.position + records.HEADER_SIZE:
                                               h.position + h.size]) for h in hs]
    assert [b[1:] for b in bodies] == [(h.base_offset, h.base_timestamp, h.max_timestamp,
                                        h.log_append_time, h.record_count) for h in hs]


@pytest.mark.parametrize("bad_at", [None, 500, 2500])  # none, in the first rows, after them
@pytest.mark.parametrize("stop", [False, True])  # errors.tolerance all / none
def test_a_new_tables_first_read_is_python_for_its_first_rows_then_c(
        bad_at: int | None, stop: bool, calls: list[bool]) -> None:
    """The writer converts a read the C path declines (a new table: no columns yet) in Python
    for its first HEAD_ROWS rows only, then offers the rest to the C path: the table, the dead
    letters and where errors.tolerance=none stops are what converting it all in Python gives."""
    from tabletopic import writer

    rnd = random.Random(1)
    values = [(None, b'{"id": %d, "user": "u%d", "amount": %d.5}' % (i, i, i))
              for i in range(3000)]
    if bad_at is not None:
        values[bad_at] = (None, b'{"id": "not a long"}')
    data = _batch(values[:1700], 0) + _batch(values[1700:], 1700, codec=rnd.choice([0, 4]))
    hs = list(records.iter_headers(data))
    got = writer._convert_columns(Converter("json"), 3, data, hs, 0, stop)
    want = writer._convert_python(Converter("json"), 3, decode_columns(data, hs, 0), stop)
    assert (got[0] is None) == (want[0] is None)
    if got[0] is not None:
        _same(got[0].combine_chunks(), want[0])
    assert [(d.record, d.reason) for d in got[1]] == [(d.record, d.reason) for d in want[1]]
    assert (got[2] and (got[2].record, got[2].reason)) == \
        (want[2] and (want[2].record, want[2].reason))
    # the whole read is declined before decoding (no columns yet); then the rest after the
    # first rows is offered: taken, or declined for its bad record (Python for it too)
    assert calls == {None: [True], 500: [] if stop else [True], 2500: [False]}[bad_at]


def _parts(data: bytes, rnd: random.Random) -> Parts:
    """`data` (whole batches) cut into runs of whole batches at random, each part a view into
    a buffer of its own with bytes around it (as a chunk cache's views are)."""
    hs = list(records.iter_headers(data))
    cuts = sorted({h.position for h in hs[1:] if rnd.random() < 0.5} | {0, len(data)})
    out: list[bytes | memoryview] = []
    for a, b in itertools.pairwise(cuts):
        pad = bytes(rnd.randrange(3))
        out.append(memoryview(pad + data[a:b] + b"tail")[len(pad): len(pad) + b - a]
                   if rnd.random() < 0.5 else data[a:b])
    return Parts(out)


@pytest.mark.parametrize("seed", range(6))
def test_a_read_in_parts_converts_as_the_joined_read(seed: int) -> None:
    """The writer's reads come as the batches' own buffers (tabletopic.columnar.Parts, no
    join): headers, records sections, the C path's table and the writer's conversion (its
    Python first rows, dead letters, tolerance=none) are those of the same bytes joined."""
    from tabletopic import writer

    rnd = random.Random(seed)
    data, base = b"", 0
    for _b in range(7):
        n = rnd.choice([1, 3, 50, 700])
        values = [(None, _value(rnd, base + i) if rnd.random() > 0.002 else b'{"id": "x"}')
                  for i in range(n)]
        data += _batch(values, base, codec=rnd.choice([0, 0, 1, 3, 4]))
        base += n
    parts = _parts(data, rnd)
    hs = list(records.iter_headers(data))
    assert len(parts) == len(data) and parts.tobytes() == data and len(parts.parts) > 1
    assert parts.headers() == hs
    assert [(bytes(b[0]), *b[1:]) for b in batch_bodies(parts, hs)] == \
        [(bytes(b[0]), *b[1:]) for b in batch_bodies(data, hs)]
    for offset in (0, base // 3, base - 1):
        got, want = _native_parts(parts, hs, offset), _native(data, offset)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            _same(got, want)
        for stop in (False, True):
            a = writer._convert_columns(Converter("json"), 3, parts, hs, offset, stop)
            b = writer._convert_columns(Converter("json"), 3, data, hs, offset, stop)
            assert (a[0] is None) == (b[0] is None)
            if a[0] is not None and b[0] is not None:
                _same(a[0], b[0])
            assert [(d.record, d.reason) for d in a[1]] == [(d.record, d.reason) for d in b[1]]
            assert (a[2] and a[2].record) == (b[2] and b[2].record)


def _native_parts(parts: Parts, hs: list[records.BatchHeader], offset: int) -> pa.Table | None:
    return Converter("json", KNOWN).convert_batches(3, parts, hs, offset)


def test_parts_refuse_a_batch_no_part_holds() -> None:
    """A part that is not whole batches, or a header of a batch no part holds whole: a
    CorruptBatchError (the C path declines the read; the joined read then says what it is)."""
    data = _batch([(None, b'{"id": 1}')] * 20, 0) + _batch([(None, b'{"id": 2}')] * 20, 20)
    hs = list(records.iter_headers(data))
    cut = hs[1].position + 10  # inside the second batch
    split = Parts([data[:cut], data[cut:]])
    with pytest.raises(records.CorruptBatchError):
        split.headers()
    with pytest.raises(records.CorruptBatchError):
        split.batch(hs[1])
    assert Converter("json", KNOWN).convert_batches(3, split, hs, 0) is None
    whole = Parts([data[: hs[1].position], data[hs[1].position:]])
    with pytest.raises(records.CorruptBatchError):  # past the end of every part
        whole.batch(dataclasses.replace(hs[1], position=len(data)))
    assert whole.batch(hs[1])[1].position == 0 and whole.batch(hs[0])[1] == hs[0]
