"""JSON Schema writer schemas for tabletopic.schemaconvert: the registered JSON Schema (an
object) gives typed Arrow columns; each value (UTF-8 JSON, as confluent-kafka's JSONSerializer
writes it after the wire-format header) is checked against those types and becomes a row.

JSON Schema -> Arrow (-> Iceberg): object with properties -> struct (properties not in the
schema are dropped); object without properties whose additionalProperties is a schema ->
map<string, _>; array with an items schema -> list; string -> string, with format date ->
date32 (date), date-time -> timestamp[us, UTC] (timestamptz; a time without offset is taken as
UTC), time -> int64 (long: microseconds since midnight, shifted to UTC when it has an offset;
Spark cannot read a table with an Iceberg time column), uuid -> string; integer
-> int64 (long); number -> float64 (double); boolean; enum / const of strings -> string. Nullable:
type [x, "null"], oneOf / anyOf of x and {"type": "null"}, or simply not required: every column
is nullable. Local $refs (#/definitions/..., #/$defs/...) are followed. A schema saying nothing
about a value (true, {}, an object or array without properties / items) keeps the value as its
JSON text (string). No Iceberg form (Conflict): several non-null types, tuple items, external
$refs, recursive definitions.

A value that does not fit its type (a string where the schema says integer, an unparseable
date, an integer beyond a long) makes the record invalid with the reason.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Hashable
from typing import Any

import msgspec
import pyarrow as pa

from tabletopic.convert import INT64_MAX, INT64_MIN, Conflict
from tabletopic.typeconvert import Shape

Coerce = Callable[[Any], Any]
Node = tuple[pa.DataType, Coerce]
MAX_DEPTH = 64
UTC = dt.UTC


def _expect(kind: type | tuple[type, ...], what: str) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            raise Conflict(f"{json.dumps(v)[:50]} is not {what}")
    return check


def _integer(v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    _expect(int, "an integer")(v)
    if not INT64_MIN <= v <= INT64_MAX:
        raise Conflict(f"integer {v} does not fit a long")
    return int(v)


def _number(v: Any) -> float:
    _expect((int, float), "a number")(v)
    return float(v)


def _timestamp(v: Any) -> dt.datetime:
    _expect(str, "a date-time string")(v)
    t = dt.datetime.fromisoformat(v)
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _time(v: Any) -> int:
    """Microseconds since midnight (UTC when the time has an offset)."""
    _expect(str, "a time string")(v)
    t = dt.time.fromisoformat(v)
    if t.tzinfo is not None:
        t = dt.datetime.combine(dt.date(2000, 1, 1), t).astimezone(UTC).time()
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


def _date(v: Any) -> dt.date:
    _expect(str, "a date string")(v)
    return dt.date.fromisoformat(v)


def _string(v: Any) -> str:
    _expect(str, "a string")(v)
    return str(v)


def _boolean(v: Any) -> bool:
    _expect(bool, "a boolean")(v)
    return bool(v)


def _json_text(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _nullable(fn: Coerce) -> Coerce:
    return lambda v: None if v is None else fn(v)


FREE: Node = (pa.string(), _json_text)
FORMATS: dict[str, Node] = {
    "date": (pa.date32(), _date),
    "date-time": (pa.timestamp("us", tz="UTC"), _timestamp),
    "time": (pa.int64(), _time),
}
SIMPLE: dict[str, Node] = {
    "integer": (pa.int64(), _integer),
    "number": (pa.float64(), _number),
    "boolean": (pa.bool_(), _boolean),
    "null": (pa.null(), lambda v: None),
}


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root

    def ref(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise Conflict(f"$ref {ref[:100]!r} to another document is not supported")
        target = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            elif isinstance(target, dict) and part in target:
                target = target[part]
            else:
                raise Conflict(f"$ref {ref[:100]!r} points nowhere")
        return target

    def node(self, s: Any, depth: int = 0) -> Node:
        if depth > MAX_DEPTH:
            raise Conflict("a recursive (or too deeply nested) schema has no Iceberg form")
        if s is True or s == {}:
            return FREE
        if not isinstance(s, dict):
            raise Conflict(f"schema {json.dumps(s)[:100]} cannot hold values")
        if "$ref" in s:
            return self.node(self.ref(str(s["$ref"])), depth + 1)
        for key in ("oneOf", "anyOf"):
            if key in s:
                branches = [b for b in s[key] if b != {"type": "null"}]
                if len(branches) != 1:
                    raise Conflict(f"{key} of {len(branches)} non-null schemas is not supported")
                return self.node(branches[0], depth + 1)
        if "allOf" in s:
            if len(s["allOf"]) != 1:
                raise Conflict("allOf of several schemas is not supported")
            return self.node(s["allOf"][0], depth + 1)
        t = s.get("type")
        if isinstance(t, list):
            kinds = [k for k in t if k != "null"]
            if len(kinds) > 1:
                raise Conflict(f"a value of types {kinds} has no single Iceberg type")
            t = kinds[0] if kinds else "null"
        if t is None:
            if "properties" in s or "additionalProperties" in s:
                t = "object"
            elif "items" in s:
                t = "array"
            elif all(isinstance(v, str) for v in s.get("enum", [s.get("const", 0)])):
                t = "string"
            else:
                return FREE
        if t == "object":
            return self.obj(s, depth)
        if t == "array":
            items = s.get("items", True)
            if isinstance(items, list) or "prefixItems" in s:
                raise Conflict("tuple items (a type per position) are not supported")
            it, ic = self.node(items, depth + 1)
            return pa.list_(it), lambda v: [_nullable(ic)(x) for x in _list(v)]
        if t == "string":
            if s.get("format") in FORMATS:
                return FORMATS[s["format"]]
            return pa.string(), _string
        if t in SIMPLE:
            return SIMPLE[t]
        raise Conflict(f"unknown JSON Schema type {t!r}")

    def obj(self, s: dict[str, Any], depth: int) -> Node:
        props = s.get("properties")
        if isinstance(props, dict) and props:
            nodes = {k: self.node(v, depth + 1) for k, v in props.items()}
            coerce = {k: _nullable(c) for k, (_t, c) in nodes.items()}

            def struct(v: Any) -> dict[str, Any]:
                _expect(dict, "an object")(v)
                return {k: c(v.get(k)) for k, c in coerce.items()}

            return pa.struct([pa.field(k, t) for k, (t, _c) in nodes.items()]), struct
        extra = s.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            vt, vc = self.node(extra, depth + 1)

            def mapping(v: Any) -> dict[str, Any]:
                _expect(dict, "an object")(v)
                return {k: _nullable(vc)(x) for k, x in v.items()}

            return pa.map_(pa.string(), vt), mapping
        return FREE


def _list(v: Any) -> list[Any]:
    _expect(list, "an array")(v)
    return list(v)


class JsonSchemaWriter:
    """One JSON Schema writer schema (usually an object)."""

    def __init__(self, text: str, deps: list[tuple[str, str]]) -> None:
        root = json.loads(text)
        top, self.coerce = _Compiler(root).node(root)
        self.shape = Shape(top, self._decode)
        self.decoder = msgspec.json.Decoder()

    def select(self, payload: bytes, framed: bool, message: str = ""
               ) -> tuple[Hashable, Shape, bytes]:
        return None, self.shape, payload

    def _decode(self, body: bytes) -> Any:
        return self.coerce(self.decoder.decode(body))


def parse_json_schema(text: str, deps: list[tuple[str, str]]) -> JsonSchemaWriter:
    return JsonSchemaWriter(text, deps)
