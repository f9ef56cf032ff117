"""`floe table replay-dlq T [--dry-run]`: dead letters whose problem is fixed (a schema
registered, a converter setting corrected) become rows of the table, each once.

The dead-letter topic (tabletopic.dlq) keeps each record's key, value and headers and adds
`floe.error.*` / `floe.source.*` headers. A replay reads every dead letter of the topic, rebuilds
the original record (source partition, offset and timestamp, the headers without floe's), and
converts it with the topic's current settings. Rows go in only for records the table does not
hold yet, checked on the snapshot the replay commits on: the commit asserts that snapshot (and
the table UUID, schema id), so a writer or Spark commit in between makes it start again
(after two such races with the table's writer held: tabletopic.ops). So a
dead letter lands at most once whatever happens around it (repeated replays, a rollback that
re-materialised the record from the log, a crash between replays). The records still bad stay
in the dead-letter topic, with the reason they fail now in the answer.

The commit is a floe commit: its snapshot carries `floe.offsets` unchanged, `floe.operation`
`replay-dlq` and `floe.dlq.offsets` (the dead-letter offsets replayed, as [start, end) ranges).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import (
    AssertCurrentSchemaId,
    AssertLastAssignedFieldId,
    TableRequirement,
)

from broker.engine import StorageEngine
from broker.protocol import records
from broker.protocol.recordcodec import Record, decode_records
from tabletopic.commit import covers
from tabletopic.config import TableTopicConfig
from tabletopic.contract import encode_offsets, snapshot_summary, table_offsets
from tabletopic.dlq import SOURCE_OFFSET, SOURCE_PARTITION
from tabletopic.keyconvert import converter, schema_parts
from tabletopic.lineage import DLQ_OFFSETS, OPERATION
from tabletopic.ops import OperationError
from tabletopic.rebuild import guards
from tabletopic.schemaconvert import SchemaById
from tabletopic.schemafetch import fetch_schemas

ATTEMPTS = 5  # replays that lost a race to another commit start again, this many times
UNHELD_ATTEMPTS = 2  # then with the writer held
Hold = Callable[[], AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class DeadLetter:
    dlq_offset: int
    partition: int
    record: Record  # as it was in the source topic


async def read_dead_letters(
    storage: StorageEngine, dlq_topic: str, source_topic: str
) -> list[DeadLetter]:
    """Every dead letter of `source_topic` in `dlq_topic` (partition 0), oldest first."""
    if dlq_topic not in storage.topics:
        return []
    out: list[DeadLetter] = []
    offset, end = storage.offsets(dlq_topic, 0)
    while offset < end:
        data = await storage.read(dlq_topic, 0, offset, 4 << 20, must_return_one=True)
        if not data:
            break
        for h in records.iter_headers(data):
            for r in decode_records(data, h):
                if r.offset < offset:
                    continue
                hs = dict(r.headers)
                if hs.get("floe.source.topic") != source_topic.encode():
                    continue
                headers = tuple(
                    (k, v) for k, v in r.headers
                    if not k.startswith("floe.error.") and not k.startswith("floe.source.")
                )
                ts = hs.get("floe.source.timestamp") or str(r.timestamp).encode()
                source = Record(int(hs[SOURCE_OFFSET] or b"-1"), int(ts), r.key, r.value, headers)
                out.append(DeadLetter(r.offset, int(hs[SOURCE_PARTITION] or b"-1"), source))
            offset = h.next_offset
    return out


def held_offsets(table: Table, wanted: list[DeadLetter]) -> set[tuple[int, int]]:
    """(partition, offset) pairs among `wanted` that the table already holds."""
    if not wanted or table.metadata.current_snapshot_id is None:
        return set()
    held: set[tuple[int, int]] = set()
    by_part: dict[int, list[int]] = {}
    for d in wanted:
        by_part.setdefault(d.partition, []).append(d.record.offset)
    for p, offs in by_part.items():  # one range per partition: no filter the size of the DLQ
        scan = table.scan(
            row_filter=f"_kafka.partition = {p} AND _kafka.offset >= {min(offs)}"
            f" AND _kafka.offset <= {max(offs)}",
            selected_fields=("_kafka",),
        ).to_arrow()
        kafka = scan.column("_kafka").combine_chunks()
        dead = set(offs)
        held |= {(p, int(o)) for o in kafka.field("offset").to_pylist() if o in dead}
    return held


def ranges(offsets: list[int]) -> list[list[int]]:
    """Sorted offsets -> [[start, end), ...] runs."""
    out: list[list[int]] = []
    for o in sorted(offsets):
        if out and out[-1][1] == o:
            out[-1][1] = o + 1
        else:
            out.append([o, o + 1])
    return out


class DlqReplay:
    def __init__(
        self, storage: StorageEngine, catalog: Catalog, schemas: SchemaById | None
    ) -> None:
        self.storage = storage
        self.catalog = catalog
        self.schemas = schemas

    async def run(
        self, topic: str, cfg: TableTopicConfig, dry_run: bool, hold: Hold | None = None
    ) -> dict[str, Any]:
        """Replay (see the module docstring). A replay that loses UNHELD_ATTEMPTS races to the
        writer's commits tries again with the writer held (`hold()`, tabletopic.ops)."""
        for attempt in range(ATTEMPTS):
            try:
                if hold is None or attempt < UNHELD_ATTEMPTS:
                    return await self._attempt(topic, cfg, dry_run)
                async with hold():
                    return await self._attempt(topic, cfg, dry_run)
            except CommitFailedException:
                continue  # the table moved under us: look again
        raise OperationError(f"replay of {topic}'s dead letters lost {ATTEMPTS} commit races")

    async def _attempt(self, topic: str, cfg: TableTopicConfig, dry_run: bool) -> dict[str, Any]:
        letters = await read_dead_letters(self.storage, cfg.dlq_topic, topic)
        table = await asyncio.to_thread(self.catalog.load_table, cfg.identifier)
        held = await asyncio.to_thread(held_offsets, table, letters)
        todo: list[DeadLetter] = []
        seen = set(held)  # and a dead letter written twice (dead letters are at least once)
        for d in letters:
            if (d.partition, d.record.offset) not in seen:
                seen.add((d.partition, d.record.offset))
                todo.append(d)
        conv = converter(cfg, table.schema().as_arrow())
        tables: list[pa.Table] = []
        replayed: list[DeadLetter] = []
        still_bad: list[dict[str, Any]] = []
        by_part: dict[int, list[DeadLetter]] = {}
        for d in todo:
            by_part.setdefault(d.partition, []).append(d)
        for p, group in sorted(by_part.items()):
            recs = [d.record for d in group]
            for sconv, srecs, subject in schema_parts(conv, recs, cfg):
                await fetch_schemas(self.schemas, sconv, srecs, subject)
            rows, dead = await asyncio.to_thread(conv.convert, p, recs)
            bad = {i.record.offset: i.reason for i in dead}
            still_bad += [{"partition": p, "offset": o, "reason": r} for o, r in bad.items()]
            replayed += [d for d in group if d.record.offset not in bad]
            if rows is not None:
                tables.append(rows)
        result: dict[str, Any] = {
            "topic": topic, "dead_letters": len(letters), "already_in_table": len(held),
            "replayed": len(replayed), "still_bad": still_bad, "dry_run": dry_run,
            "snapshot": None,
        }
        if dry_run or not tables:
            return result
        data = pa.concat_tables(tables, promote_options="permissive")
        dlq = ranges([d.dlq_offset for d in replayed])
        result["snapshot"] = await asyncio.to_thread(self._commit, topic, table, data, dlq)
        return result

    def _commit(self, topic: str, table: Table, data: pa.Table, dlq: list[list[int]]) -> int:
        meta = table.metadata
        summary = {
            **snapshot_summary(topic, encode_offsets(table_offsets(table))),
            OPERATION: "replay-dlq",
            DLQ_OFFSETS: json.dumps(dlq),
        }
        tx = table.transaction()
        evolve = not covers(table, data.schema)
        if evolve:
            with tx.update_schema() as update:
                update.union_by_name(data.schema)
        tx.append(data, snapshot_properties=summary)
        requirements: list[TableRequirement] = [
            *guards(table),
            AssertCurrentSchemaId.model_validate({"current-schema-id": meta.current_schema_id}),
        ]
        if evolve:
            requirements.append(AssertLastAssignedFieldId.model_validate(
                {"last-assigned-field-id": meta.last_column_id}))
        response = self.catalog.commit_table(table, tuple(requirements), tx._updates)
        current = response.metadata.current_snapshot_id
        assert current is not None
        return current
