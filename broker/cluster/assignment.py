"""Partition leadership over live brokers: a pure function the controller applies.

Partitions are named by their stream ids. Rules, in order:
0. a partition pinned to a live broker (AlterPartitionReassignments: `pins`) goes to it, and
   is never moved by the rules below (a pin to a broker not live is ignored until it is);
1. a partition whose leader is not live (dead, gone, or none) goes to the live broker with
   the fewest partitions (ties: the lowest node id);
2. then, while one broker leads two or more partitions more than another, its unpinned
   partition with the highest stream id moves to the least loaded broker (pinned partitions
   count in a broker's load);
3. every partition whose leader changes gets the next leader epoch; the others are untouched
   (a leader keeps its partitions unless balance asks otherwise).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from broker.cluster.model import Leader


def assign(
    live: Collection[int], current: Mapping[int, Leader], pins: Mapping[int, int] | None = None
) -> dict[int, Leader]:
    """The partitions whose leader changes, with their new leader and epoch. `pins`: stream
    id -> the node id it is pinned to."""
    nodes = sorted(set(live))
    if not nodes:
        return {}
    led: dict[int, list[int]] = {n: [] for n in nodes}
    owner: dict[int, int] = {}
    fixed = {sid for sid, n in (pins or {}).items() if n in led and sid in current}
    for sid in sorted(current):
        n = (pins or {})[sid] if sid in fixed else current[sid].node_id  # rule 0
        if n in led:
            led[n].append(sid)
            owner[sid] = n
    for sid in sorted(current):
        if sid not in owner:  # rule 1
            n = min(nodes, key=lambda m: (len(led[m]), m))
            led[n].append(sid)
            owner[sid] = n
    for _ in range(len(current)):  # rule 2: each move narrows the gap; bounded anyway
        movable = [m for m in nodes if any(s not in fixed for s in led[m])]
        if not movable:
            break
        hi = max(movable, key=lambda m: (len(led[m]), -m))
        lo = min(nodes, key=lambda m: (len(led[m]), m))
        if len(led[hi]) - len(led[lo]) <= 1:
            break
        sid = max(s for s in led[hi] if s not in fixed)
        led[hi].remove(sid)
        led[lo].append(sid)
        owner[sid] = lo
    return {sid: Leader(n, current[sid].epoch + 1)  # rule 3
            for sid, n in owner.items() if n != current[sid].node_id}
