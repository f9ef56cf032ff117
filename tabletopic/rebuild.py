"""`floe table rebuild`: the rows from some offsets on, rewritten from the retained log in one
catalog commit (tabletopic.ops holds the writer meanwhile).

One transaction deletes the rows at and after the given offsets (pyiceberg's copy-on-write
delete) and appends the records [offset, table's offset) read again from the log and converted
with the topic's current settings, chunk by chunk (each chunk's Parquet files are written as it
is converted, so memory stays bounded); `floe.offsets` does not change. The commit asserts the
table UUID, the snapshot and schema it was built on: readers see the old rows until it lands,
then the rebuilt ones, never a gap or a duplicate. Records that do not convert now go to the
dead-letter topic (idempotently: tabletopic.dlq) and are left out, as the writer does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertLastAssignedFieldId,
    AssertRefSnapshotId,
    AssertTableUUID,
    TableRequirement,
)

from broker.engine import StorageEngine
from broker.protocol import records
from broker.protocol.recordcodec import Record, decode_records
from tabletopic.commit import covers
from tabletopic.config import TableTopicConfig
from tabletopic.contract import MAIN, encode_offsets, snapshot_summary, table_offsets
from tabletopic.dlq import DeadLetters
from tabletopic.keyconvert import converter, schema_parts
from tabletopic.lineage import OPERATION, REBUILT
from tabletopic.schemaconvert import SchemaById
from tabletopic.schemafetch import fetch_schemas
from tabletopic.writer import READ_BYTES


def guards(table: Table) -> list[TableRequirement]:
    """The requirements of an operation's commit: the table and snapshot it was built on."""
    meta = table.metadata
    return [
        AssertTableUUID(uuid=meta.table_uuid),
        AssertRefSnapshotId.model_validate({"ref": MAIN, "snapshot-id": meta.current_snapshot_id}),
    ]


def condition(frm: dict[int, int] | None) -> str:
    """The rows at and after the given offsets (None: every row), as a pyiceberg row filter."""
    if frm is None:
        return "true"
    return " OR ".join(
        f"(_kafka.partition = {p} AND _kafka.offset >= {o})" for p, o in sorted(frm.items())
    )


async def rebuild(
    storage: StorageEngine,
    catalog: Catalog,
    schemas: SchemaById | None,
    topic: str,
    cfg: TableTopicConfig,
    frm: dict[int, int],
    everything: bool = False,
) -> dict[str, Any]:
    """Rewrite the rows of partitions `frm` from their offsets on (see the module docstring);
    `everything`: every row goes first (those below the log start too). Raises
    CommitFailedException when the table moved meanwhile (nothing changed)."""
    table = await asyncio.to_thread(catalog.load_table, cfg.identifier)
    upto = table_offsets(table)
    rewritten = {str(p): [o, upto[p]] for p, o in sorted(frm.items()) if o < upto.get(p, o)}
    summary = {**snapshot_summary(topic, encode_offsets(upto)), OPERATION: "rebuild",
               REBUILT: json.dumps(rewritten)}
    tx = table.transaction()
    await asyncio.to_thread(tx.delete, condition(None if everything else frm), summary)
    conv = converter(cfg, table.schema().as_arrow())
    dlq = DeadLetters(storage, cfg.dlq_topic, topic)
    rows = dead = 0
    evolved = False
    for p, start in sorted(frm.items()):
        offset = start
        while offset < upto.get(p, start):
            data = await storage.read(topic, p, offset, READ_BYTES, must_return_one=True)
            if not data:
                break
            recs: list[Record] = []
            for h in records.iter_headers(data):
                recs += [r for r in decode_records(data, h)
                         if offset <= r.offset < upto[p]]
                offset = min(h.next_offset, upto[p])
            for sconv, srecs, subject in schema_parts(conv, recs, cfg):
                await fetch_schemas(schemas, sconv, srecs, subject)
            chunk, invalid = await asyncio.to_thread(conv.convert, p, recs)
            if invalid:
                await dlq.write(p, invalid)
                dead += len(invalid)
            if chunk is not None:
                evolved |= await asyncio.to_thread(_append, tx, catalog, chunk, summary)
                rows += chunk.num_rows
    if not any(isinstance(u, AddSnapshotUpdate) for u in tx._updates):
        with tx.update_snapshot(snapshot_properties=summary).fast_append():
            pass  # nothing deleted or added: still a floe snapshot, with the offsets
    meta = table.metadata
    requirements: list[TableRequirement] = [
        *guards(table),
        AssertCurrentSchemaId.model_validate({"current-schema-id": meta.current_schema_id}),
    ]
    if evolved:
        requirements.append(AssertLastAssignedFieldId.model_validate(
            {"last-assigned-field-id": meta.last_column_id}))
    response = await asyncio.to_thread(catalog.commit_table, table, tuple(requirements),
                                       tx._updates)
    return {"topic": topic, "offsets": upto, "from": frm, "rows": rows, "dead_letters": dead,
            "snapshot": response.metadata.current_snapshot_id}


def _append(tx: Transaction, catalog: Catalog, chunk: Any, summary: dict[str, str]) -> bool:
    """Append one converted chunk to the transaction, widening the staged schema first when the
    chunk has columns it lacks; True if it did."""
    staged = tx._table
    view = Table(staged.name(), tx.table_metadata, staged.metadata_location, staged.io, catalog)
    evolve = not covers(view, chunk.schema)
    if evolve:
        with tx.update_schema() as update:
            update.union_by_name(chunk.schema)
    tx.append(chunk, snapshot_properties=summary)
    return evolve
