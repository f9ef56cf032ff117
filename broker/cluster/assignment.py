"""Partition leadership over live brokers: a pure function the controller applies.

Partitions are named by their stream ids. Rules, in order:
1. a partition whose leader is not live (dead, gone, or none) goes to the live broker with
   the fewest partitions (ties: the lowest node id);
2. then, while one broker leads two or more partitions more than another, its partition with
   the highest stream id moves to the least loaded broker;
3. every partition whose leader changes gets the next leader epoch; the others are untouched
   (a leader keeps its partitions unless balance asks otherwise).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from broker.cluster.model import Leader


def assign(live: Collection[int], current: Mapping[int, Leader]) -> dict[int, Leader]:
    """The partitions whose leader changes, with their new leader and epoch."""
    nodes = sorted(set(live))
    if not nodes:
        return {}
    led: dict[int, list[int]] = {n: [] for n in nodes}
    owner: dict[int, int] = {}
    for sid in sorted(current):
        n = current[sid].node_id
        if n in led:
            led[n].append(sid)
            owner[sid] = n
    for sid in sorted(current):
        if sid not in owner:  # rule 1
            n = min(nodes, key=lambda m: (len(led[m]), m))
            led[n].append(sid)
            owner[sid] = n
    for _ in range(len(current)):  # rule 2: each move narrows the gap; bounded anyway
        hi = max(nodes, key=lambda m: (len(led[m]), -m))
        lo = min(nodes, key=lambda m: (len(led[m]), m))
        if len(led[hi]) - len(led[lo]) <= 1:
            break
        sid = max(led[hi])
        led[hi].remove(sid)
        led[lo].append(sid)
        owner[sid] = lo
    return {sid: Leader(n, current[sid].epoch + 1)  # rule 3
            for sid, n in owner.items() if n != current[sid].node_id}
