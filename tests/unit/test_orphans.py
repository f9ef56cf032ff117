from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from tabletopic.orphans import remove_orphan_files


def test_only_old_unreferenced_files_go(tmp_path: Path) -> None:
    cat = SqlCatalog("floe", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "w").as_uri())
    cat.create_namespace("default")
    t = cat.create_table("default.t", schema=pa.schema([pa.field("a", pa.int64())]))
    t.append(pa.table({"a": [1, 2]}))
    data = Path(t.location().removeprefix("file://")) / "data"
    old, fresh = data / "orphan-old.parquet", data / "orphan-new.parquet"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    then = time.time() - 100
    os.utime(old, (then, then))
    removed = remove_orphan_files(t, min_age_s=50)
    assert removed == [str(old)]
    assert fresh.exists() and t.scan().to_arrow().num_rows == 2  # referenced files stay
