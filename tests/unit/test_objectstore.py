"""One behaviour suite, run against every object store backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.objectstore import ObjectNotFoundError, ObjectStore, open_object_store


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    url = "memory://" if request.param == "memory" else (tmp_path / "objs").as_uri()
    s = open_object_store(url)
    yield s
    await s.close()


async def test_put_get_range_list_delete(store: ObjectStore) -> None:
    await store.put("wal/0001", b"0123456789")
    await store.put("wal/0002", memoryview(b"abc"))
    await store.put("other/x", b"")
    assert await store.get("wal/0001") == b"0123456789"
    assert await store.get_range("wal/0001", 3, 4) == b"3456"
    assert await store.get("other/x") == b""
    assert await store.list("wal/") == ["wal/0001", "wal/0002"]
    await store.put("wal/0001", b"new")  # overwrite is whole
    assert await store.get("wal/0001") == b"new"
    await store.delete("wal/0001")
    await store.delete("wal/0001")  # idempotent
    with pytest.raises(ObjectNotFoundError):
        await store.get("wal/0001")
    assert await store.list("wal/") == ["wal/0002"]


async def test_keys_cannot_escape_the_store(tmp_path: Path) -> None:
    s = open_object_store(str(tmp_path / "objs"))
    with pytest.raises(Exception, match="invalid object key"):
        await s.put("../escape", b"x")
