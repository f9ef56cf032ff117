"""Avro schemas: parsing (fastavro) and the spec's schema-resolution rules for compatibility.

`parse_avro(text, named)` validates a schema with fastavro (references' named types given in
`named`) and returns it as JSON data. `avro_can_read(reader, writer, names)` lists why data
written with `writer` cannot be read with `reader` (empty: it can), following the Avro
specification's "Schema Resolution": same primitives; promotions int->long/float/double,
long->float/double, float->double, string<->bytes; records matched by name (or reader alias),
each reader field read from the writer's field of that name (or alias) or else needing a
default; enums whose writer symbols the reader has (or a reader default); arrays by items,
maps by values, fixed by name and size; a writer union needs every branch readable, a reader
union needs one branch that reads the writer.
"""

from __future__ import annotations

import json
from typing import Any

import fastavro
import fastavro.schema

from broker.schemaregistry.errors import invalid_schema

PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
              ("long", "double"), ("float", "double"), ("string", "bytes"), ("bytes", "string")}
MAX_DEPTH = 200  # nesting deeper than this is refused rather than recursed into


def parse_avro(text: str, named: dict[str, Any]) -> Any:
    """The schema as JSON data; RegistryError 42201 if fastavro refuses it. `named` (fullname
    -> parsed schema, fastavro's named_schemas) holds referenced types and receives this
    schema's named types."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise invalid_schema(f"not JSON: {e}") from None
    try:
        fastavro.parse_schema(data, named_schemas=named, _write_hint=False)
    except (fastavro.schema.SchemaParseException, fastavro.schema.UnknownType, ValueError,
            TypeError, KeyError, AttributeError, RecursionError) as e:
        raise invalid_schema(f"{type(e).__name__}: {e}") from None
    return data


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def collect_names(schema: Any, namespace: str | None, names: dict[str, Any],
                  depth: int = 0) -> None:
    """Record every named type (record, enum, fixed) defined in schema by its full name."""
    if depth > MAX_DEPTH:
        raise invalid_schema("nested too deeply")
    if isinstance(schema, list):
        for s in schema:
            collect_names(s, namespace, names, depth + 1)
    elif isinstance(schema, dict):
        t = schema.get("type")
        if t in ("record", "error", "enum", "fixed"):
            ns = schema.get("namespace", namespace) if "." not in schema["name"] else \
                schema["name"].rsplit(".", 1)[0]
            full = _fullname(schema["name"], ns)
            names[full] = {**schema, "_fullname": full, "_ns": ns}
            if t in ("record", "error"):
                fields = schema.get("fields")
                if not isinstance(fields, list) or not all(
                        isinstance(f, dict) and "name" in f and "type" in f for f in fields):
                    raise invalid_schema(f"record {full} needs a list of fields, each with a"
                                         " name and a type")
                for f in fields:
                    collect_names(f["type"], ns, names, depth + 1)
        elif t == "array":
            collect_names(schema["items"], namespace, names, depth + 1)
        elif t == "map":
            collect_names(schema["values"], namespace, names, depth + 1)
        elif isinstance(t, dict | list):
            collect_names(t, namespace, names, depth + 1)


def check_defaults(names: dict[str, Any]) -> None:
    """42201 for a record field whose default does not fit its type (as Avro's parser and
    Confluent's registry refuse it: "Invalid default for field"). fastavro checks primitive
    and union defaults itself; this also covers int ranges, arrays, maps, enums and records.
    A union's default may fit any branch (as fastavro accepts it)."""
    for record in names.values():
        if record.get("type") not in ("record", "error"):
            continue
        for f in record["fields"]:
            if "default" in f and not _default_ok(f["type"], record["_ns"], f["default"],
                                                   names, 0):
                raise invalid_schema(f"Invalid default for field {f['name']}:"
                                     f" {json.dumps(f['default'])[:100]} not a"
                                     f" {json.dumps(f['type'])[:200]}")


INT_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def _default_ok(schema: Any, ns: str | None, value: Any, names: dict[str, Any],
                depth: int) -> bool:
    if depth > MAX_DEPTH:
        return False
    s, ns = _resolve(schema, ns, names)
    kind = _kind(s)
    if kind == "union":
        return any(_default_ok(b, ns, value, names, depth + 1) for b in s)
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
    if kind in ("float", "double"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind in ("string", "bytes", "fixed"):
        return isinstance(value, str)
    if kind == "enum":
        return isinstance(value, str) and value in s["symbols"]
    if kind == "array":
        return isinstance(value, list) and all(
            _default_ok(s["items"], ns, v, names, depth + 1) for v in value)
    if kind == "map":
        return isinstance(value, dict) and all(
            _default_ok(s["values"], ns, v, names, depth + 1) for v in value.values())
    if kind in ("record", "error"):
        return isinstance(value, dict) and all(
            _default_ok(f["type"], ns, value[f["name"]], names, depth + 1) if f["name"] in value
            else "default" in f for f in s["fields"])
    return False


def _resolve(schema: Any, namespace: str | None, names: dict[str, Any]) -> tuple[Any, str | None]:
    """Named references replaced by their definition; a {"type": X} wrapper unwrapped."""
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return schema, namespace
        full = schema if schema in names else _fullname(schema, namespace)
        d = names.get(full)
        if d is None:
            raise invalid_schema(f"unknown type {schema!r}")
        return d, d["_ns"]
    if isinstance(schema, dict):
        t = schema.get("type")
        if t in ("record", "error", "enum", "fixed"):
            return _resolve(_fullname_of(schema, namespace), namespace, names)
        if isinstance(t, str) and t in PRIMITIVES:
            return t, namespace  # logical types are read as their underlying type
        if isinstance(t, str) and t not in ("array", "map"):
            return _resolve(t, namespace, names)
        if isinstance(t, dict | list):
            return _resolve(t, namespace, names)
    return schema, namespace


def _fullname_of(schema: dict[str, Any], namespace: str | None) -> str:
    name = str(schema["name"])
    return name if "." in name else _fullname(name, schema.get("namespace", namespace))


def _kind(s: Any) -> str:
    if isinstance(s, str):
        return s
    if isinstance(s, list):
        return "union"
    return str(s.get("type"))


def avro_can_read(reader: Any, writer: Any, rnames: dict[str, Any], wnames: dict[str, Any]
                  ) -> list[str]:
    """Why `reader` cannot read data written with `writer` (empty list: it can)."""
    problems: list[str] = []
    _check(reader, None, writer, None, rnames, wnames, "", problems, set(), 0)
    return problems


def _check(r: Any, rns: str | None, w: Any, wns: str | None, rnames: dict[str, Any],
           wnames: dict[str, Any], path: str, out: list[str], seen: set[tuple[str, str]],
           depth: int) -> None:
    if depth > MAX_DEPTH:
        out.append(f"{path or '/'}: nested too deeply to compare")
        return
    r, rns = _resolve(r, rns, rnames)
    w, wns = _resolve(w, wns, wnames)
    rk, wk = _kind(r), _kind(w)
    where = path or "/"
    if wk == "union":
        for i, branch in enumerate(w):
            _check(r, rns, branch, wns, rnames, wnames, f"{path}/union[{i}]", out, seen,
                   depth + 1)
        return
    if rk == "union":
        for branch in r:
            trial: list[str] = []
            _check(branch, rns, w, wns, rnames, wnames, path, trial, set(seen), depth + 1)
            if not trial:
                return
        out.append(f"{where}: reader union has no branch for writer type {wk}")
        return
    if rk in PRIMITIVES or wk in PRIMITIVES:
        if rk != wk and (wk, rk) not in PROMOTIONS:
            out.append(f"{where}: writer type {wk} cannot be read as {rk}")
        return
    if rk != wk and not ({rk, wk} <= {"record", "error"}):
        out.append(f"{where}: writer type {wk} cannot be read as {rk}")
        return
    if rk in ("record", "error", "enum", "fixed"):
        rname, wname = r["_fullname"], w["_fullname"]
        aliases = {_fullname(a, rns) for a in r.get("aliases", [])}
        if rname.rsplit(".", 1)[-1] != wname.rsplit(".", 1)[-1] and wname not in aliases:
            out.append(f"{where}: writer {rk} {wname} has a different name than reader {rname}")
            return
    if rk == "fixed":
        if r["size"] != w["size"]:
            out.append(f"{where}: fixed size {w['size']} read as size {r['size']}")
    elif rk == "enum":
        missing = [s for s in w["symbols"] if s not in r["symbols"]]
        if missing and "default" not in r:
            out.append(f"{where}: reader enum {r['_fullname']} lacks symbols {missing}")
    elif rk == "array":
        _check(r["items"], rns, w["items"], wns, rnames, wnames, f"{path}/items", out, seen,
               depth + 1)
    elif rk == "map":
        _check(r["values"], rns, w["values"], wns, rnames, wnames, f"{path}/values", out,
               seen, depth + 1)
    elif rk in ("record", "error"):
        key = (r["_fullname"], w["_fullname"])
        if key in seen:  # a recursive type already being compared
            return
        seen.add(key)
        wfields = {f["name"]: f for f in w.get("fields", [])}
        for f in r.get("fields", []):
            match = next((wfields[n] for n in [f["name"], *f.get("aliases", [])]
                          if n in wfields), None)
            fpath = f"{path}/{f['name']}"
            if match is None:
                if "default" not in f:
                    out.append(f"{fpath}: reader field {f['name']!r} is missing in the writer"
                               " and has no default")
            else:
                _check(f["type"], rns, match["type"], wns, rnames, wnames, fpath, out, seen,
                       depth + 1)
