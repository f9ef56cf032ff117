"""`floe groups list|describe`: members, assignments, committed offsets, end offsets, lag."""

from __future__ import annotations

import datetime
import json
import struct
from dataclasses import asdict, dataclass
from typing import Any

from kio.index import load_entity_schema
from kio.serial import entity_reader
from kio.static.constants import EntityType

from broker.client import Client, nested


@dataclass
class PartitionLag:
    topic: str
    partition: int
    member: str | None
    committed: int | None
    end: int
    lag: int | None


@dataclass
class GroupReport:
    group: str
    state: str
    protocol: str
    members: list[dict[str, Any]]
    partitions: list[PartitionLag]


def _assignment(data: bytes) -> list[tuple[str, int]]:
    if len(data) < 2:
        return []
    version = min(struct.unpack_from(">h", data, 0)[0], 3)
    cls = load_entity_schema("consumer_protocol_assignment", version, EntityType.data)
    a: Any = entity_reader(cls)(data, 2)[0]
    return [(tp.topic, p) for tp in a.assigned_partitions for p in tp.partitions]


def list_groups(bootstrap: str) -> list[tuple[str, str]]:
    with Client(bootstrap) as c:
        r = c.request(16, 4, states_filter=())
        return [(g.group_id, g.group_state) for g in r.groups]


def describe_group(bootstrap: str, group: str) -> GroupReport:
    with Client(bootstrap) as c:
        d = c.request(15, 5, groups=(group,), include_authorized_operations=False).groups[0]
        members, owner = [], {}
        for m in d.members:
            parts = _assignment(m.member_assignment) if d.protocol_type == "consumer" else []
            members.append(
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "host": m.client_host,
                    "instance_id": m.group_instance_id,
                    "assignment": [f"{t}-{p}" for t, p in parts],
                }
            )
            for tp in parts:
                owner[tp] = m.member_id
        req_group = nested(9, 8, "OffsetFetchRequestGroup")
        f = c.request(
            9, 8, groups=(req_group(group_id=group, topics=None),), require_stable=False
        ).groups[0]
        committed = {
            (t.name, p.partition_index): p.committed_offset for t in f.topics for p in t.partitions
        }
        keys = sorted(set(committed) | set(owner))
        ends = _end_offsets(c, keys)
    rows = []
    for t, p in keys:
        co = committed.get((t, p), -1)
        end = ends.get((t, p), -1)
        rows.append(
            PartitionLag(
                t,
                p,
                owner.get((t, p)),
                co if co >= 0 else None,
                end,
                end - co if co >= 0 and end >= 0 else None,
            )
        )
    return GroupReport(group, d.group_state, d.protocol_data, members, rows)


def _end_offsets(c: Client, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    if not keys:
        return {}
    part = nested(2, 7, "ListOffsetsPartition")
    topic = nested(2, 7, "ListOffsetsTopic")
    by_topic: dict[str, list[int]] = {}
    for t, p in keys:
        by_topic.setdefault(t, []).append(p)
    r = c.request(
        2,
        7,
        replica_id=-1,
        isolation_level=0,
        topics=tuple(
            topic(
                name=t,
                partitions=tuple(
                    part(partition_index=p, current_leader_epoch=-1, timestamp=-1) for p in ps
                ),
            )
            for t, ps in by_topic.items()
        ),
    )
    return {
        (t.name, p.partition_index): p.offset if p.error_code == 0 else -1
        for t in r.topics
        for p in t.partitions
    }


def render(report: GroupReport, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {**asdict(report), "time": datetime.datetime.now(datetime.UTC).isoformat()}, indent=2
        )
    lines = [
        f"group {report.group}: {report.state}"
        + (f" ({report.protocol})" if report.protocol else "")
    ]
    for m in report.members:
        lines.append(
            f"  member {m['member_id']} ({m['client_id']} {m['host']}): "
            + (", ".join(m["assignment"]) or "no partitions")
        )
    lines.append(f"  {'TOPIC':<24} {'PART':>4} {'COMMITTED':>10} {'END':>10} {'LAG':>8}  MEMBER")
    for r in report.partitions:
        lines.append(
            f"  {r.topic:<24} {r.partition:>4} "
            f"{'-' if r.committed is None else r.committed:>10} {r.end:>10} "
            f"{'-' if r.lag is None else r.lag:>8}  {r.member or '-'}"
        )
    return "\n".join(lines)
