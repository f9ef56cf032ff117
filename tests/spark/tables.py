"""Tables written the way the broker writes a table topic: `_kafka` struct plus JSON value
columns (tabletopic.convert), one append per commit carrying `floe.offsets` in the snapshot
summary and in the table property (tabletopic.commit, what TableWriter commits with)."""

from __future__ import annotations

import json
import time
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from broker.protocol.recordcodec import Record
from tabletopic.commit import commit_offsets
from tabletopic.contract import table_offsets
from tabletopic.convert import Converter

Key = tuple[int, int]  # (_kafka.partition, _kafka.offset)


def create_topic_table(
    catalog: Catalog, namespace: str, name: str, topic: str | None = None
) -> Table:
    catalog.create_namespace_if_not_exists(namespace)
    props = {"format-version": "2"}
    if topic is not None:
        props["floe.topic"] = topic
    return catalog.create_table((namespace, name), schema=Converter("json").schema(),
                                properties=props)


def broker_commit(catalog: Catalog, ident: tuple[str, str], partition: int, count: int,
                  topic: str = "t") -> None:
    """Append `count` records after the partition's committed offset with the broker's own
    commit (tabletopic.commit.commit_offsets: explicit requirements, its own retries)."""
    table = catalog.load_table(ident)
    start = table_offsets(table).get(partition, 0)
    now = int(time.time() * 1000)
    records = [
        Record(offset=o, timestamp=now, key=f"k{o}".encode(),
               value=json.dumps({"n": o, "p": partition, "text": f"r{partition}-{o}"}).encode(),
               headers=(("h", b"v"),))
        for o in range(start, start + count)
    ]
    data, invalid = Converter("json", table.schema().as_arrow()).convert(partition, records)
    assert data is not None and not invalid
    commit_offsets(catalog, ident, topic, data, {partition: start}, {partition: start + count})


def fill(catalog: Catalog, ident: tuple[str, str], commits: int, partitions: int = 2,
         per_commit: int = 5, topic: str = "t") -> None:
    for i in range(commits):
        broker_commit(catalog, ident, i % partitions, per_commit, topic)


def rows(catalog: Catalog, ident: tuple[str, str]) -> dict[Key, dict[str, Any]]:
    """Every row by (partition, offset); fails on a duplicate."""
    out: dict[Key, dict[str, Any]] = {}
    for r in catalog.load_table(ident).scan().to_arrow().to_pylist():
        key = (r["_kafka"]["partition"], r["_kafka"]["offset"])
        assert key not in out, f"duplicate row {key}"
        out[key] = r
    return out


def data_files(catalog: Catalog, ident: tuple[str, str]) -> list[str]:
    table = catalog.load_table(ident)
    return [t.file.file_path for t in table.scan().plan_files()]


def expected_keys(offsets: dict[int, int]) -> set[Key]:
    return {(p, o) for p, end in offsets.items() for o in range(end)}
