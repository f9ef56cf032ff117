"""The table-topic contract: what a table written by the broker carries, and what every other
reader or writer of it (the broker's writer and commits, `floe compact` / `floe sql`, tests)
relies on. Standard library only, so that any side can import it.

  - `floe.topic` (table property, and in every floe snapshot's summary): the topic the table
    is written from. A table with this property is a table topic.
  - `floe.offsets` (table property, and in every floe snapshot's summary): the broker's
    position, JSON {"partition": next offset}; only floe commits change it, every other commit
    (a Spark rewrite or expiry) must carry it over unchanged. See tabletopic.commit.
  - `floe.commit-id` (snapshot summary): a fresh UUID per floe commit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Protocol

TOPIC = "floe.topic"
OFFSETS = "floe.offsets"
COMMIT_ID = "floe.commit-id"
MAIN = "main"  # the branch floe commits to


class _Table(Protocol):
    @property
    def properties(self) -> Mapping[str, str]: ...


def is_table_topic(properties: Mapping[str, str]) -> bool:
    """Whether a table with these properties is a table topic (written by the broker)."""
    return TOPIC in properties


def parse_offsets(raw: str | None) -> dict[int, int]:
    """The value of `floe.offsets` -> {partition: next offset}; unset or empty: {}."""
    return {int(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


def encode_offsets(offsets: Mapping[int, int]) -> str:
    """{partition: next offset} -> the value of `floe.offsets` (partitions in order)."""
    return json.dumps({str(k): v for k, v in sorted(offsets.items())})


def offsets_of(properties: Mapping[str, str]) -> dict[int, int]:
    """The broker's position recorded in a table's properties (or a snapshot's summary)."""
    return parse_offsets(properties.get(OFFSETS))


def snapshot_summary(topic: str, offsets: str) -> dict[str, str]:
    """The summary properties of a floe commit's snapshot (`offsets` already encoded)."""
    return {OFFSETS: offsets, TOPIC: topic, COMMIT_ID: str(uuid.uuid4())}


def table_properties(topic: str) -> dict[str, str]:
    """The floe properties a new table topic is created with."""
    return {TOPIC: topic}


def table_offsets(table: _Table) -> dict[int, int]:
    """The broker's position recorded in a loaded table (pyiceberg's Table)."""
    return offsets_of(table.properties)
