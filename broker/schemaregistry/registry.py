"""The registry's operations, callable in-process (`SchemaRegistry`) and served over HTTP
(.http). Semantics follow Confluent's REST API reference:
- ids are global and stable: the same schema (type, canonical text, references) has one id
  in every subject, and keeps it after its versions are deleted and it is registered again;
- registering a schema a subject already has (live) returns its id (idempotent); otherwise
  the subject's compatibility level (its own, else the global one, else BACKWARD) is checked
  against its live versions, and the new version is the highest one so far + 1;
- deletes are soft first (the version is hidden, `?deleted=true` shows it), hard
  (`permanent=true`) only after a soft delete; a version another live schema references
  cannot be deleted (42206).
Every error is a RegistryError with Confluent's code.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from broker.schemaregistry import errors
from broker.schemaregistry.protobuf import serialized
from broker.schemaregistry.schemas import LEVELS, TYPES, Parsed, incompatibilities, parse
from broker.schemaregistry.store import Reference, RegistryStore, StoredSchema, VersionRow
from s3stream.metadata import MetadataError, MetadataStore
from s3stream.metadata.backend import Connection

DEFAULT_LEVEL = "BACKWARD"
MAX_REFERENCE_DEPTH = 32
MAX_REFERENCES = 1000
MAX_SUBJECT_CHARS = 1000


@dataclass(frozen=True)
class SubjectVersion:
    subject: str
    version: int
    schema: StoredSchema

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"subject": self.subject, "version": self.version,
                               "id": self.schema.id, "schema": self.schema.schema}
        return out | schema_extras(self.schema)


def schema_extras(s: StoredSchema) -> dict[str, Any]:
    """schemaType (omitted for AVRO, as Confluent does) and references (when there are any)."""
    out: dict[str, Any] = {}
    if s.schema_type != "AVRO":
        out["schemaType"] = s.schema_type
    if s.references:
        out["references"] = [r.to_json() for r in s.references]
    return out


def parse_version(text: str) -> int | None:
    """A version id (1..2^31-1), None for 'latest' / -1; RegistryError 42202 otherwise."""
    if text in ("latest", "-1"):
        return None
    if text.isdigit() and 1 <= int(text) <= 2**31 - 1:
        return int(text)
    raise errors.invalid_version(text[:100])


def check_subject(subject: str) -> None:
    if not subject or len(subject) > MAX_SUBJECT_CHARS or not subject.isprintable():
        raise errors.invalid_subject(subject[:100])


class SchemaRegistry:
    def __init__(self, meta: MetadataStore) -> None:
        self.store = RegistryStore(meta)

    async def open(self) -> None:
        await self.store.migrate()

    async def _run(self, fn: Any, write: bool = False) -> Any:
        try:
            return await self.store.run(fn, write)
        except MetadataError as e:
            raise errors.store_error(str(e)) from e

    # -- helpers on the store's thread ---------------------------------------------------------
    def _deps(self, db: Connection, refs: tuple[Reference, ...], depth: int = 0,
              seen: set[int] | None = None) -> list[tuple[str, str, str]]:
        """Referenced schemas, dependencies first; 42201 for one that does not exist."""
        if depth > MAX_REFERENCE_DEPTH:
            raise errors.invalid_schema("references nested too deeply")
        seen = set() if seen is None else seen
        out: list[tuple[str, str, str]] = []
        for ref in refs:
            row = next((v for v in RegistryStore.versions(db, ref.subject)
                        if v.version == ref.version and not v.deleted), None)
            target = None if row is None else RegistryStore.schema_by_id(db, row.schema_id)
            if target is None:
                raise errors.invalid_schema(
                    f"reference {ref.name!r} to subject {ref.subject!r} version"
                    f" {ref.version} not found")
            if target.id in seen:
                continue
            seen.add(target.id)
            out += self._deps(db, target.references, depth + 1, seen)
            out.append((ref.name, target.schema_type, target.schema))
        return out

    def _parse_stored(self, db: Connection, s: StoredSchema) -> Parsed:
        return parse(s.schema_type, s.schema, self._deps(db, s.references))

    def _version(self, db: Connection, subject: str, version: str, deleted: bool = False
                 ) -> VersionRow:
        wanted = parse_version(version)
        rows = RegistryStore.versions(db, subject)
        if not rows or (not deleted and all(r.deleted for r in rows)):
            raise errors.subject_not_found(subject)
        visible = [r for r in rows if deleted or not r.deleted]
        if wanted is None:
            if not visible:
                raise errors.version_not_found(subject, version)
            return visible[-1]
        match = next((r for r in visible if r.version == wanted), None)
        if match is None:
            raise errors.version_not_found(subject, wanted)
        return match

    def _subject_version(self, db: Connection, row: VersionRow) -> SubjectVersion:
        s = RegistryStore.schema_by_id(db, row.schema_id)
        if s is None:
            raise errors.store_error(f"schema {row.schema_id} missing")
        return SubjectVersion(row.subject, row.version, s)

    def _level(self, db: Connection, subject: str) -> str:
        return (RegistryStore.config(db, subject) or RegistryStore.config(db, "")
                or DEFAULT_LEVEL)

    def _check(self, db: Connection, subject: str, new: Parsed, level: str | None,
               against: str | None) -> list[str]:
        live = [r for r in RegistryStore.versions(db, subject) if not r.deleted]
        if against is not None:
            live = [self._version(db, subject, against)]
        existing = [(r.version, self._parse_stored(db, self._subject_version(db, r).schema))
                    for r in live]
        return incompatibilities(level or self._level(db, subject), new, existing)

    @staticmethod
    def _new_schema(schema_type: str | None, refs: list[dict[str, Any]] | None
                    ) -> tuple[str, tuple[Reference, ...]]:
        schema_type = (schema_type or "AVRO").upper()
        if schema_type not in TYPES:
            raise errors.invalid_schema(f"unknown schemaType {schema_type[:50]!r}")
        if refs is not None and len(refs) > MAX_REFERENCES:
            raise errors.invalid_schema("too many references")
        try:
            out = tuple(Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
                        for r in refs or [])
        except (KeyError, TypeError, ValueError):
            raise errors.invalid_schema("a reference needs name, subject and version") from None
        return schema_type, out

    async def _prepare(self, subject: str | None, stype: str, schema: str,
                       refs: tuple[Reference, ...]) -> None:
        """PROTOBUF .proto text is compiled by protoc (~0.2 s): do it off the store's thread
        first, for the new schema and the subject's live versions, so that the transaction
        that parses them again finds them cached. Errors surface in the transaction."""
        if stype != "PROTOBUF":
            return

        def inputs(db: Connection) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
            out = [(stype, schema, self._deps(db, refs))]
            for r in RegistryStore.versions(db, subject or ""):
                s = RegistryStore.schema_by_id(db, r.schema_id)
                if s is not None and not r.deleted:
                    out.append((s.schema_type, s.schema, self._deps(db, s.references)))
            return out

        try:
            todo = await self._run(inputs)
            for t, text, deps in todo:
                await asyncio.to_thread(parse, t, text, deps)
        except errors.RegistryError:
            pass

    async def formatted(self, s: StoredSchema, fmt: str | None) -> StoredSchema:
        """s with its schema in the requested format: `serialized` turns PROTOBUF .proto text
        into a base64 FileDescriptorProto (what Confluent's Protobuf deserializers ask for)."""
        if fmt != "serialized" or s.schema_type != "PROTOBUF":
            return s
        deps = await self._run(lambda db: self._deps(db, s.references))
        parsed = await asyncio.to_thread(parse, s.schema_type, s.schema, deps)
        return dataclasses.replace(s, schema=serialized(parsed.data))

    # -- the API -----------------------------------------------------------------------------
    async def register(self, subject: str, schema: str, schema_type: str | None = None,
                       references: list[dict[str, Any]] | None = None) -> tuple[int, int]:
        """(id, version) of schema under subject; RegistryError 409 if incompatible."""
        check_subject(subject)
        stype, refs = self._new_schema(schema_type, references)
        await self._prepare(subject, stype, schema, refs)

        def txn(db: Connection) -> tuple[int, int]:
            parsed = parse(stype, schema, self._deps(db, refs))
            fingerprint = parsed.fingerprint(refs)
            known = RegistryStore.schema_by_fingerprint(db, fingerprint)
            rows = RegistryStore.versions(db, subject)
            if known is not None:
                for r in rows:
                    if r.schema_id == known.id and not r.deleted:
                        return known.id, r.version
            problems = self._check(db, subject, parsed, None, None)
            if problems:
                raise errors.incompatible(problems)
            schema_id = known.id if known is not None else RegistryStore.insert_schema(
                db, stype, parsed.canonical, refs, fingerprint)
            version = max((r.version for r in rows), default=0) + 1
            RegistryStore.insert_version(db, subject, version, schema_id)
            return schema_id, version

        result: tuple[int, int] = await self._run(txn, write=True)
        return result

    async def lookup(self, subject: str, schema: str, schema_type: str | None = None,
                     references: list[dict[str, Any]] | None = None, deleted: bool = False
                     ) -> SubjectVersion:
        """The subject's version holding this schema; 40401 / 40403 if none."""
        stype, refs = self._new_schema(schema_type, references)
        await self._prepare(None, stype, schema, refs)

        def txn(db: Connection) -> SubjectVersion:
            rows = [r for r in RegistryStore.versions(db, subject) if deleted or not r.deleted]
            if not rows:
                raise errors.subject_not_found(subject)
            parsed = parse(stype, schema, self._deps(db, refs))
            known = RegistryStore.schema_by_fingerprint(db, parsed.fingerprint(refs))
            for r in reversed(rows):
                if known is not None and r.schema_id == known.id:
                    return SubjectVersion(subject, r.version, known)
            raise errors.schema_not_found()

        result: SubjectVersion = await self._run(txn)
        return result

    async def get_by_id(self, schema_id: int) -> StoredSchema:
        """The schema with this id (40403 if no version of any subject holds it)."""
        def txn(db: Connection) -> StoredSchema:
            s = RegistryStore.schema_by_id(db, schema_id)
            if s is None or not RegistryStore.versions_of_schema(db, schema_id, True):
                raise errors.schema_not_found()
            return s

        result: StoredSchema = await self._run(txn)
        return result

    async def id_usage(self, schema_id: int, deleted: bool) -> list[VersionRow]:
        def txn(db: Connection) -> list[VersionRow]:
            rows = RegistryStore.versions_of_schema(db, schema_id, deleted)
            if RegistryStore.schema_by_id(db, schema_id) is None or not (
                    rows or RegistryStore.versions_of_schema(db, schema_id, True)):
                raise errors.schema_not_found()
            return rows

        result: list[VersionRow] = await self._run(txn)
        return result

    async def subjects(self, deleted: bool = False) -> list[str]:
        result: list[str] = await self._run(lambda db: RegistryStore.subjects(db, deleted))
        return result

    async def versions(self, subject: str, deleted: bool = False) -> list[int]:
        def txn(db: Connection) -> list[int]:
            rows = [r.version for r in RegistryStore.versions(db, subject)
                    if deleted or not r.deleted]
            if not rows:
                raise errors.subject_not_found(subject)
            return rows

        result: list[int] = await self._run(txn)
        return result

    async def get_version(self, subject: str, version: str, deleted: bool = False
                          ) -> SubjectVersion:
        result: SubjectVersion = await self._run(
            lambda db: self._subject_version(db, self._version(db, subject, version, deleted)))
        return result

    async def latest(self, subject: str) -> SubjectVersion:
        return await self.get_version(subject, "latest")

    async def referenced_by(self, subject: str, version: str) -> list[int]:
        def txn(db: Connection) -> list[int]:
            row = self._version(db, subject, version)
            return RegistryStore.referenced_by(db, subject, row.version)

        result: list[int] = await self._run(txn)
        return result

    async def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        def txn(db: Connection) -> list[int]:
            rows = RegistryStore.versions(db, subject)
            if not rows:
                raise errors.subject_not_found(subject)
            live = [r.version for r in rows if not r.deleted]
            if permanent and live:
                raise errors.subject_not_soft_deleted(subject)
            if not permanent and not live:
                raise errors.subject_soft_deleted(subject)
            targets = [r.version for r in rows] if permanent else live
            for v in targets:
                if RegistryStore.referenced_by(db, subject, v):
                    raise errors.reference_exists(f"{subject} version {v}")
            if permanent:
                RegistryStore.remove_versions(db, subject, targets)
                RegistryStore.set_config(db, subject, None)
            else:
                RegistryStore.set_deleted(db, subject, targets)
            return targets

        result: list[int] = await self._run(txn, write=True)
        return result

    async def delete_version(self, subject: str, version: str, permanent: bool = False) -> int:
        def txn(db: Connection) -> int:
            # a numbered version is found soft-deleted or not; "latest" is the latest live one
            row = self._version(db, subject, version,
                                deleted=permanent or parse_version(version) is not None)
            if permanent and not row.deleted:
                raise errors.version_not_soft_deleted(subject, row.version)
            if not permanent and row.deleted:
                raise errors.version_soft_deleted(subject, row.version)
            if RegistryStore.referenced_by(db, subject, row.version):
                raise errors.reference_exists(f"{subject} version {row.version}")
            if permanent:
                RegistryStore.remove_versions(db, subject, [row.version])
            else:
                RegistryStore.set_deleted(db, subject, [row.version])
            return row.version

        result: int = await self._run(txn, write=True)
        return result

    async def check(self, subject: str, version: str | None, schema: str,
                    schema_type: str | None = None,
                    references: list[dict[str, Any]] | None = None) -> list[str]:
        """What makes schema incompatible with the subject's version (or, with version None,
        with the versions its level checks); an empty list: compatible."""
        stype, refs = self._new_schema(schema_type, references)
        await self._prepare(subject, stype, schema, refs)

        def txn(db: Connection) -> list[str]:
            parsed = parse(stype, schema, self._deps(db, refs))
            if version is None:
                return self._check(db, subject, parsed, None, None)
            level = self._level(db, subject)
            # against one version: the level's direction, without the transitive part
            return self._check(db, subject, parsed, level.removesuffix("_TRANSITIVE"), version)

        result: list[str] = await self._run(txn)
        return result

    async def get_config(self, subject: str | None, default_to_global: bool = False) -> str:
        def txn(db: Connection) -> str:
            if subject is None:
                return RegistryStore.config(db, "") or DEFAULT_LEVEL
            level = RegistryStore.config(db, subject)
            if level is None:
                if not default_to_global:
                    raise errors.compatibility_not_configured(subject)
                return RegistryStore.config(db, "") or DEFAULT_LEVEL
            return level

        result: str = await self._run(txn)
        return result

    async def set_config(self, subject: str | None, level: str) -> str:
        level = level.upper() if isinstance(level, str) else ""
        if level not in LEVELS:
            raise errors.invalid_compatibility(str(level)[:50])
        if subject is not None:
            check_subject(subject)
        await self._run(lambda db: RegistryStore.set_config(db, subject or "", level),
                        write=True)
        return level

    async def delete_config(self, subject: str | None) -> str:
        """Drop a subject's level (the global one: back to BACKWARD); returns the old one."""
        def txn(db: Connection) -> str:
            old = RegistryStore.config(db, subject or "")
            if old is None and subject is not None:
                if not RegistryStore.versions(db, subject):
                    raise errors.subject_not_found(subject)
                raise errors.compatibility_not_configured(subject)
            RegistryStore.set_config(db, subject or "", None)
            return old or DEFAULT_LEVEL

        result: str = await self._run(txn, write=True)
        return result
