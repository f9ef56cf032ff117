"""The in-process registry (broker.schemaregistry.SchemaRegistry) on SQLite and PostgreSQL
metadata stores: the API later parts of issue 14 call (register, get_by_id, latest, lookup),
id and version rules, deletes, migrations, and concurrent writers on one PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.schemaregistry import RegistryError, SchemaRegistry
from s3stream.metadata import MetadataStore, open_metadata_store


def record(name: str, *fields: str) -> str:
    return json.dumps({"type": "record", "name": name,
                       "fields": [{"name": f, "type": "string", "default": ""}
                                  for f in fields]})


@pytest.fixture(params=["sqlite", "postgresql"])
def meta_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def meta(meta_url: str) -> AsyncIterator[MetadataStore]:
    store = open_metadata_store(meta_url)
    await store.open()
    yield store
    await store.close()


async def code_of(coro: object) -> int:
    with pytest.raises(RegistryError) as e:
        await coro  # type: ignore[misc]
    return e.value.code


async def test_ids_are_global_and_stable_and_versions_follow_confluent(
        meta: MetadataStore) -> None:
    reg = SchemaRegistry(meta)
    await reg.open()
    await reg.open()  # migrations run once; a second open changes nothing
    a = record("A", "x")
    assert await reg.register("s1", a) == (1, 1)
    assert await reg.register("s1", a) == (1, 1)  # idempotent
    assert await reg.register("s2", a) == (1, 1)  # same schema, other subject: same id
    # the same schema written differently (whitespace) is the same schema
    assert await reg.register("s1", json.dumps(json.loads(a), indent=4)) == (1, 1)
    assert await reg.register("s1", record("A", "x", "y")) == (2, 2)
    assert (await reg.latest("s1")).schema.id == 2
    assert (await reg.get_by_id(1)).schema == json.dumps(json.loads(a), separators=(",", ":"))
    assert (await reg.lookup("s1", a)).version == 1
    # soft then hard delete of the latest version: the number is free again, ids are not
    assert await reg.delete_version("s1", "latest") == 2
    assert await reg.versions("s1") == [1]
    assert await reg.versions("s1", deleted=True) == [1, 2]
    assert await code_of(reg.delete_version("s1", "2")) == 40406  # already soft-deleted
    assert await code_of(reg.delete_version("s1", "1", permanent=True)) == 40407
    assert await code_of(reg.get_version("s1", "2")) == 40402
    assert (await reg.get_version("s1", "2", deleted=True)).schema.id == 2
    assert await reg.delete_version("s1", "2", permanent=True) == 2
    assert await reg.register("s1", record("A", "x", "z")) == (3, 2)
    assert await reg.register("s1", record("A", "x", "y")) == (2, 3)  # the old id comes back
    # a subject wholly deleted: its schemas stay reachable by id while another subject
    # holds them, and are 40403 once no version at all refers to them
    await reg.delete_subject("s2")
    await reg.delete_subject("s2", permanent=True)
    assert (await reg.get_by_id(1)).id == 1
    await reg.delete_subject("s1")
    await reg.delete_subject("s1", permanent=True)
    assert await code_of(reg.get_by_id(1)) == 40403
    assert await code_of(reg.latest("s1")) == 40401
    assert await reg.register("s3", a) == (1, 1)  # re-registered: the same id as before


async def test_config_levels_and_refusals(meta: MetadataStore) -> None:
    reg = SchemaRegistry(meta)
    await reg.open()
    await reg.register("s", record("A", "x"))
    assert await reg.get_config(None) == "BACKWARD"
    assert await code_of(reg.get_config("s")) == 40408
    assert await reg.get_config("s", default_to_global=True) == "BACKWARD"
    await reg.set_config("s", "full_transitive")
    assert await reg.get_config("s") == "FULL_TRANSITIVE"
    assert await code_of(reg.set_config("s", "SOMETIMES")) == 42203
    incompatible = json.dumps({"type": "record", "name": "A",
                               "fields": [{"name": "x", "type": "int"}]})
    assert await code_of(reg.register("s", incompatible)) == 409
    assert await reg.check("s", None, incompatible)
    assert await reg.delete_config("s") == "FULL_TRANSITIVE"
    await reg.set_config(None, "NONE")
    assert await reg.register("s", incompatible) == (2, 2)
    assert await code_of(reg.register("", incompatible)) == 42208
    assert await code_of(reg.register("a\x00b", incompatible)) == 42208
    assert await code_of(reg.register("s", "{", "AVRO")) == 42201
    assert await code_of(reg.get_version("s", "0")) == 42202


async def test_brokers_registering_at_once_never_share_an_id_or_version(
        pg_url: str) -> None:
    stores = [open_metadata_store(pg_url) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        regs = [SchemaRegistry(s) for s in stores]
        for r in regs:
            await r.open()
        await regs[0].set_config(None, "NONE")
        results = await asyncio.gather(*(
            regs[i % 3].register(f"subj{i % 2}", record(f"R{i}", "x")) for i in range(30)))
        assert len({schema_id for schema_id, _ in results}) == 30
        for subject in ("subj0", "subj1"):
            versions = sorted(v for (schema_id, v), i in zip(results, range(30), strict=True)
                              if i % 2 == int(subject[-1]))
            assert versions == list(range(1, 16))
            assert await regs[2].versions(subject) == list(range(1, 16))
    finally:
        for s in stores:
            await s.close()
