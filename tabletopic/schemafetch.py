"""Giving a schema converter the writer schemas its records need, from the Schema Registry
(by_schema_id: the records' ids; by_latest_schema: the subject's latest version), with the
schemas they reference; used by the table writer, rebuild and replay."""

from __future__ import annotations

from typing import Any

from broker.protocol.recordcodec import Record
from broker.schemaregistry.errors import RegistryError
from tabletopic.schemaconvert import SchemaById, SchemaConverter, StoredSchemaLike


async def fetch_schemas(
    schemas: SchemaById | None, conv: SchemaConverter, recs: list[Record], subject: str
) -> None:
    """Give the converter every writer schema these records need: their ids (by_schema_id)
    or the subject's latest version (by_latest_schema), with the schemas they reference.
    What the registry does not hold (40401/40402/40403) or a registry that is off makes
    those records invalid (the reason goes to the DLQ); any other registry error is
    raised: the writer retries, nothing is lost."""
    if conv.value_type == "by_latest_schema":
        if schemas is None:
            conv.latest, conv.latest_error = None, "the schema registry is off"
            return
        try:
            latest = (await schemas.get_version(subject, "latest")).schema
        except RegistryError as e:
            if e.code not in (40401, 40402):
                raise
            conv.latest, conv.latest_error = None, f"no schema for subject {subject!r}"
            return
        if latest.id not in conv.schemas:
            await _add_schema(schemas, conv, latest)
        conv.latest = latest.id
        return
    for sid in sorted(conv.missing_ids(recs)):
        if schemas is None:
            conv.add_unknown(sid, "the schema registry is off (--schema-registry)")
            continue
        try:
            s = await schemas.get_by_id(sid)
        except RegistryError as e:
            if e.code != 40403:
                raise
            conv.add_unknown(sid, "not in the schema registry")
            continue
        await _add_schema(schemas, conv, s)


async def _add_schema(
    schemas: SchemaById | None, conv: SchemaConverter, s: StoredSchemaLike
) -> None:
    """Hand a schema to the converter with its references, dependencies first."""
    registry = schemas
    assert registry is not None
    deps: list[tuple[str, str]] = []
    seen: set[int] = set()

    async def walk(refs: tuple[Any, ...], depth: int) -> None:
        for ref in refs:
            if depth > 32:
                raise RegistryError(422, 42201, "references nested too deeply")
            target = (await registry.get_version(ref.subject, str(ref.version))).schema
            if target.id not in seen:
                seen.add(target.id)
                await walk(target.references, depth + 1)
                deps.append((ref.name, target.schema))

    try:
        await walk(s.references, 0)
    except RegistryError as e:
        if e.code not in (40401, 40402, 42201):
            raise
        conv.add_unknown(s.id, f"a reference cannot be read: {e}")
        return
    conv.add_schema(s.id, s.schema_type, s.schema, deps)
