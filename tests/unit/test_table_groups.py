"""broker.groups.tablegroups: a table topic's read-only consumer group `floe-table.<table>`."""

from __future__ import annotations

import pytest

from broker.errors import ErrorCode, KafkaError
from broker.groups import tablegroups
from broker.metadata.tablework import Progress
from s3stream.metadata import MetadataUnavailableError

ORDERS = Progress("orders", "default.orders", {0: 4, 1: 6}, 1234, 1_700_000_000_000)
CLICKS = Progress("clicks", "web.clicks", {0: 0}, None, 1_700_000_000_001)


class Rows:
    def __init__(self, rows: list[Progress] | Exception) -> None:
        self.rows = rows
        self.reads = 0

    async def progress(self) -> list[Progress]:
        self.reads += 1
        if isinstance(self.rows, Exception):
            raise self.rows
        return self.rows


def test_the_prefix_is_reserved() -> None:
    assert tablegroups.is_table_group("floe-table.default.orders")
    assert tablegroups.is_table_group("floe-table.")  # reserved even with no table name
    assert not tablegroups.is_table_group("floe-tables")
    assert not tablegroups.is_table_group("billing")
    assert tablegroups.group_id_of("default.orders") == "floe-table.default.orders"
    tablegroups.refuse("billing")
    with pytest.raises(KafkaError) as e:
        tablegroups.refuse("floe-table.x.y")  # no such table: reserved all the same
    assert e.value.code == ErrorCode.group_authorization_failed
    assert e.value.code == tablegroups.REFUSAL
    assert not ErrorCode.group_authorization_failed.retriable


def test_a_table_group_answers_the_table_offsets() -> None:
    groups = tablegroups.groups_of([ORDERS, CLICKS])
    assert sorted(groups) == ["floe-table.default.orders", "floe-table.web.clicks"]
    g = groups["floe-table.default.orders"]
    row = g.get(g.group_id, "orders", 1)
    assert row is not None
    assert (row.topic, row.partition, row.committed_offset, row.leader_epoch) == (
        "orders", 1, 6, -1)
    assert row.metadata == "Iceberg table default.orders at snapshot 1234\0"  # a C string
    assert g.metadata == "Iceberg table default.orders at snapshot 1234"
    assert g.get(g.group_id, "orders", 2) is None  # a partition the table holds nothing of
    assert g.get(g.group_id, "clicks", 0) is None  # another topic
    assert g.get("floe-table.web.clicks", "orders", 0) is None
    assert {k: r.committed_offset for k, r in g.of_group(g.group_id).items()} == {
        ("orders", 0): 4, ("orders", 1): 6}
    clicks = groups["floe-table.web.clicks"]
    assert clicks.metadata == "Iceberg table web.clicks at no snapshot"
    assert tablegroups.listed(groups) == dict.fromkeys(groups, ("consumer", "Empty"))
    unknown = tablegroups.NoOffsets()
    assert unknown.get("floe-table.x.y", "orders", 0) is None
    assert unknown.of_group("floe-table.x.y") == {}


async def test_read_once_per_call_and_unreadable_is_retriable() -> None:
    rows = Rows([ORDERS])
    assert list(await tablegroups.read(rows)) == ["floe-table.default.orders"]
    assert rows.reads == 1
    rows.rows = [ORDERS, CLICKS]  # a new commit published: the next read sees it
    assert len(await tablegroups.read(rows)) == 2
    assert await tablegroups.read(None) == {}  # an engine without table topics
    with pytest.raises(KafkaError) as e:
        await tablegroups.read(Rows(MetadataUnavailableError("database unreachable")))
    assert e.value.code == ErrorCode.coordinator_not_available
    assert ErrorCode.coordinator_not_available.retriable
