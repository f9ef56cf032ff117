"""JSON Schema: parsing (the `jsonschema` library checks a schema against its metaschema) and
a documented subset of Confluent's compatibility rules.

`json_can_read(reader, writer)` lists why some document valid under `writer` may be invalid
under `reader` (empty: every one is valid), comparing, recursively:
- `type`: the reader's types must include the writer's (`integer` is read by `number`);
- objects: a property the writer has and the reader lacks is fine when the reader's content
  model is open (no `additionalProperties: false`), incompatible when it is closed; a property
  the reader adds is fine when the writer's model is closed, incompatible when it is open (an
  old document may hold anything under that name); `required` may not gain names; a property
  both have is compared recursively; `additionalProperties: false` may not appear in the
  reader when the writer was open;
- arrays: `items` (one schema) compared recursively;
- `enum`: the reader's values must include the writer's;
- bounds (`minLength`, `maxLength`, `minimum`, `maximum`, `exclusiveMinimum`,
  `exclusiveMaximum`, `minItems`, `maxItems`, `minProperties`, `maxProperties`,
  `pattern`, `multipleOf`, `const`, `format`): the reader may drop one or widen it, not add or
  narrow one;
- every other keyword (`$ref`, `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`,
  `patternProperties`, `dependentSchemas`, tuple `items`, ...) must be equal in both schemas:
  a change to one of them is reported as incompatible ("not compared by floe"), never
  silently accepted.
`true`/`{}` accept everything; `false` accepts nothing.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from broker.schemaregistry.errors import invalid_schema

MAX_DEPTH = 200
HANDLED = {"type", "properties", "additionalProperties", "required", "items", "enum",
           "title", "description", "$schema", "$id", "default", "examples", "$comment",
           "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
           "exclusiveMaximum", "minItems", "maxItems", "minProperties", "maxProperties",
           "pattern", "multipleOf", "const", "format", "definitions", "$defs"}
LOWER = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties")
UPPER = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties")
EXACT = ("pattern", "multipleOf", "const", "format")


def parse_json_schema(text: str) -> Any:
    """The schema as JSON data; RegistryError 42201 unless it is valid under its metaschema."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise invalid_schema(f"not JSON: {e}") from None
    if not isinstance(data, dict | bool):
        raise invalid_schema("a JSON Schema is an object or a boolean")
    try:
        jsonschema.validators.validator_for(data).check_schema(data)  # type: ignore[arg-type]
    except (jsonschema.exceptions.SchemaError, RecursionError) as e:
        raise invalid_schema(f"JSON Schema: {getattr(e, 'message', e)}") from None
    return data


def _types(s: dict[str, Any]) -> set[str] | None:
    t = s.get("type")
    if t is None:
        return None  # any type
    return {t} if isinstance(t, str) else set(t)


def _open(s: dict[str, Any]) -> bool:
    return s.get("additionalProperties", True) is not False


def json_can_read(reader: Any, writer: Any) -> list[str]:
    out: list[str] = []
    _check(reader, writer, "", out, 0)
    return out


def _check(r: Any, w: Any, path: str, out: list[str], depth: int) -> None:
    where = path or "/"
    if depth > MAX_DEPTH:
        out.append(f"{where}: nested too deeply to compare")
        return
    if r is True or r == {} or w is False:
        return
    if r is False:
        out.append(f"{where}: reader accepts nothing")
        return
    if w is True:
        w = {}
    if not isinstance(r, dict) or not isinstance(w, dict):
        out.append(f"{where}: not a schema")
        return
    for key in sorted((set(r) | set(w)) - HANDLED):
        if r.get(key) != w.get(key):
            out.append(f"{where}: keyword {key!r} changed (not compared by floe)")
    rt, wt = _types(r), _types(w)
    if rt is not None:
        if wt is None:
            out.append(f"{where}: reader restricts type to {sorted(rt)}, writer allowed any")
        else:
            lost = {t for t in wt if t not in rt and not (t == "integer" and "number" in rt)}
            if lost:
                out.append(f"{where}: writer types {sorted(lost)} not accepted by reader")
    if "enum" in r:
        if "enum" not in w:
            out.append(f"{where}: reader adds an enum")
        else:
            missing = [v for v in w["enum"] if v not in r["enum"]]
            if missing:
                out.append(f"{where}: reader enum lacks {missing}")
    for k in LOWER:
        if k in r and (k not in w or not _num_le(r[k], w[k])):
            out.append(f"{where}: {k} added or raised")
    for k in UPPER:
        if k in r and (k not in w or not _num_le(w[k], r[k])):
            out.append(f"{where}: {k} added or lowered")
    for k in EXACT:
        if k in r and r.get(k) != w.get(k):
            out.append(f"{where}: {k} added or changed")
    _check_object(r, w, path, out, depth)
    ri, wi = r.get("items"), w.get("items")
    if isinstance(ri, list) or isinstance(wi, list):
        if ri != wi:
            out.append(f"{where}: tuple items changed (not compared by floe)")
    elif ri is not None:
        _check(ri, True if wi is None else wi, f"{path}/items", out, depth + 1)


def _num_le(a: Any, b: Any) -> bool:
    return isinstance(a, int | float) and isinstance(b, int | float) and a <= b


def _check_object(r: dict[str, Any], w: dict[str, Any], path: str, out: list[str],
                  depth: int) -> None:
    where = path or "/"
    rprops: dict[str, Any] = r.get("properties", {})
    wprops: dict[str, Any] = w.get("properties", {})
    new_required = set(r.get("required", [])) - set(w.get("required", []))
    if new_required:
        out.append(f"{where}: required properties added: {sorted(new_required)}")
    if _open(w) and not _open(r):
        out.append(f"{where}: the reader closes an open content model")
    ra, wa = r.get("additionalProperties"), w.get("additionalProperties")
    if isinstance(ra, dict) and ra != wa:
        out.append(f"{where}: additionalProperties schema changed (not compared by floe)")
    for name in sorted(set(wprops) - set(rprops)):
        if not _open(r):
            out.append(f"{where}: property {name!r} removed from a closed content model")
    for name in sorted(set(rprops) - set(wprops)):
        if _open(w):
            out.append(f"{where}: property {name!r} added to an open content model")
    for name in sorted(set(rprops) & set(wprops)):
        _check(rprops[name], wprops[name], f"{path}/{name}", out, depth + 1)
