"""The map between a table topic's snapshots and the log: `floe table lineage` and `floe table
locate` (served by the broker's admin port, tabletopic.ops).

Every floe snapshot carries `floe.offsets` (tabletopic.contract) in its summary, so a snapshot's
offset range in partition P is [its parent's offset of P, its own): the records it added (or
dead-lettered). A range that goes backwards is a rewind (`floe table rebuild`): the rows from
the new offset on were removed. Snapshots that are not ancestors of the current one were rolled
back (`floe table rollback`); the snapshot log says when each snapshot became current.
"""

from __future__ import annotations

import json
from typing import Any

from pyiceberg.table import Table

from tabletopic.contract import OFFSETS, offsets_of

OPERATION = "floe.operation"  # set by floe's own operations: rebuild, replay-dlq
DLQ_OFFSETS = "floe.dlq.offsets"  # replay-dlq: the dead-letter offsets it replayed, as ranges
REBUILT = "floe.rebuilt"  # rebuild: {partition: [from, to)} rewritten from the log


def lineage(table: Table) -> dict[str, Any]:
    """{"current": id, "snapshots": [...oldest first], "history": [{"at", "snapshot"}]}: each
    snapshot with its time (ms), operation, parent, offsets and per-partition ranges."""
    meta = table.metadata
    by_id = {s.snapshot_id: s for s in meta.snapshots}
    current = meta.current_snapshot_id
    ancestry: set[int] = set()
    sid = current
    while sid is not None and sid in by_id and sid not in ancestry:
        ancestry.add(sid)
        sid = by_id[sid].parent_snapshot_id
    out = []
    for s in sorted(meta.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0)):
        summary = dict(s.summary.additional_properties) if s.summary else {}
        offsets = offsets_of(summary)
        parent = by_id.get(s.parent_snapshot_id) if s.parent_snapshot_id is not None else None
        before = offsets_of(dict(parent.summary.additional_properties)) if (
            parent is not None and parent.summary is not None
        ) else {}
        ranges = {
            str(p): [before.get(p), o] for p, o in sorted(offsets.items()) if before.get(p) != o
        }
        out.append(
            {
                "snapshot_id": s.snapshot_id,
                "parent_id": s.parent_snapshot_id,
                "timestamp_ms": s.timestamp_ms,
                "operation": summary.get(OPERATION)
                or (s.summary.operation.value if s.summary else "unknown"),
                "floe": OFFSETS in summary,
                "offsets": {str(p): o for p, o in sorted(offsets.items())},
                "ranges": ranges,
                "dlq_offsets": json.loads(summary.get(DLQ_OFFSETS, "[]")),
                "rebuilt": json.loads(summary.get(REBUILT, "{}")),
                "added_records": int(summary.get("added-records", "0")),
                "deleted_records": int(summary.get("deleted-records", "0")),
                "total_records": int(summary.get("total-records", "0")),
                "current": s.snapshot_id == current,
                "rolled_back": s.snapshot_id not in ancestry,
            }
        )
    history = [{"at": e.timestamp_ms, "snapshot": e.snapshot_id} for e in meta.snapshot_log]
    return {"current": current, "snapshots": out, "history": history}


def locate(doc: dict[str, Any], partition: int, offset: int) -> dict[str, Any] | None:
    """The snapshot in the current snapshot's ancestry that first holds the record at
    (partition, offset): the last one whose range added it after any rewind that removed it.
    None: the table does not hold it (yet)."""
    holder: dict[str, Any] | None = None
    for s in doc["snapshots"]:
        if s["rolled_back"]:
            continue
        rebuilt = s.get("rebuilt", {}).get(str(partition))
        if rebuilt is not None and rebuilt[0] <= offset < rebuilt[1]:
            holder = s  # rewritten from the log by a rebuild (its last snapshot is current)
        r = s["ranges"].get(str(partition))
        if r is None:
            continue
        start, end = r
        if start is not None and end < start:  # a rewind: rows from `end` on were removed
            if offset >= end:
                holder = None
        elif (start is None or start <= offset) and offset < end:
            holder = s
    return holder


def render(topic: str, doc: dict[str, Any]) -> str:
    """People's view of lineage(): one line per snapshot, oldest first."""
    import datetime

    lines = [f"{topic}: {len(doc['snapshots'])} snapshots, current {doc['current']}"]
    for s in doc["snapshots"]:
        at = datetime.datetime.fromtimestamp(s["timestamp_ms"] / 1000, datetime.UTC)
        ranges = " ".join(
            f"p{p}:[{'start' if a is None else a},{b})" for p, (a, b) in s["ranges"].items()
        )
        mark = "*" if s["current"] else ("x" if s["rolled_back"] else " ")
        lines.append(
            f"{mark} {s['snapshot_id']:>20} {at:%Y-%m-%d %H:%M:%S.%f}"[:-3]
            + f" {s['operation']:<10} +{s['added_records']} -{s['deleted_records']}"
            f" rows={s['total_records']} {ranges or '(no offsets moved)'}"
            + "".join(f" dlq:[{a},{b})" for a, b in s["dlq_offsets"])
            + "".join(f" rebuilt p{p}:[{a},{b})" for p, (a, b) in s["rebuilt"].items())
        )
    seen: set[int] = set()
    for h in doc.get("history", []):  # a snapshot made current a second time: a rollback
        if h["snapshot"] in seen:
            at = datetime.datetime.fromtimestamp(h["at"] / 1000, datetime.UTC)
            lines.append(f"  rollback at {at:%Y-%m-%d %H:%M:%S}: {h['snapshot']} made current "
                         "again")
        seen.add(h["snapshot"])
    lines.append("* current   x rolled back (not an ancestor of the current snapshot)")
    return "\n".join(lines)
