"""`floe cluster status`: the cluster as its rows say (brokers with their leases, the
controller, partition leaders with epochs, partitions pinned to a broker by
AlterPartitionReassignments) and where the group coordinator slots are
(broker.cluster.coordinators over the live brokers). Read from the metadata database itself
(`--metadata URL`, one read-only transaction) or from a broker's admin port (`--metrics
HOST:PORT`: its /status, which lists brokers and leases but not partitions)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from broker.cluster.coordinators import COORDINATOR_SLOTS, slot_owner
from broker.cluster.model import NO_LEADER
from s3stream.metadata.base import StoreBase


@dataclass(frozen=True)
class BrokerRow:
    node_id: int
    host: str
    port: int
    rack: str | None
    lease_expires_ms: int | None  # None: not known (an admin port that did not say)
    live: bool


@dataclass(frozen=True)
class ClusterStatus:
    now_ms: int
    brokers: list[BrokerRow]
    controller: int
    partitions: list[tuple[str, int, int, int]] | None = None  # topic, partition, leader, epoch
    slots: dict[int, int] = field(default_factory=dict)  # coordinator slot -> node id
    # partitions pinned by AlterPartitionReassignments: topic, partition, leader, target
    pins: list[tuple[str, int, int, int]] | None = None


def _slots(brokers: list[BrokerRow]) -> dict[int, int]:
    live = sorted(b.node_id for b in brokers if b.live and b.port > 0)
    return {s: slot_owner(s, live) for s in range(COORDINATOR_SLOTS)}


def read_metadata(store: StoreBase) -> ClusterStatus:
    """One read-only transaction over the cluster's rows (run it on the store's thread)."""
    now = int(time.time() * 1000)
    with store._txn(read_only=True) as db:
        rows = db.execute("SELECT node_id, host, port, rack, lease_expires_ms FROM"
                          " kafka_brokers ORDER BY node_id").fetchall()
        value = db.execute("SELECT value FROM kafka_meta WHERE key='controller'").fetchone()
        parts = db.execute("SELECT topic, partition, leader, leader_epoch, target_leader"
                           " FROM kafka_partitions ORDER BY topic, partition").fetchall()
    brokers = [BrokerRow(int(n), str(h), int(p), r, int(e), int(e) > now)
               for n, h, p, r, e in rows]
    node = str(value[0] if value else "").partition(" ")[0]
    controller = int(node) if node.lstrip("-").isdigit() else NO_LEADER
    if controller not in {b.node_id for b in brokers if b.live}:
        controller = NO_LEADER
    return ClusterStatus(now, brokers, controller,
                         [(str(t), int(p), int(n), int(e)) for t, p, n, e, _ in parts],
                         _slots(brokers),
                         [(str(t), int(p), int(n), int(target)) for t, p, n, _, target in parts
                          if int(target) != NO_LEADER])


def read_admin(address: str, timeout_s: float = 10.0) -> ClusterStatus:
    """From a broker's /status: the brokers it knows live (and their leases)."""
    with urllib.request.urlopen(f"http://{address}/status", timeout=timeout_s) as r:
        doc: dict[str, Any] = json.loads(r.read())
    listed = doc.get("brokers") or []
    brokers = [BrokerRow(int(b["node_id"]), str(b["host"]), int(b["port"]), b.get("rack"),
                         b.get("lease_expires_ms"), True) for b in listed]
    controller = next((int(b["node_id"]) for b in listed if b.get("controller")), NO_LEADER)
    return ClusterStatus(int(time.time() * 1000), brokers, controller, None, _slots(brokers))


def render(s: ClusterStatus) -> str:
    out = [f"brokers ({sum(b.live for b in s.brokers)} live), controller:"
           f" {s.controller if s.controller != NO_LEADER else 'none'}"]
    out.append(f"  {'node':>4}  {'address':<22} {'rack':<10} {'lease':<16} role")
    for b in s.brokers:
        if b.lease_expires_ms is None:
            lease = "?"
        else:
            left = (b.lease_expires_ms - s.now_ms) / 1000
            lease = f"{left:.1f} s left" if b.live else f"expired {-left:.1f} s ago"
        role = "controller" if b.node_id == s.controller else ("" if b.live else "dead")
        out.append(f"  {b.node_id:>4}  {b.host + ':' + str(b.port):<22} {b.rack or '-':<10}"
                   f" {lease:<16} {role}".rstrip())
    if s.partitions is None:
        out.append("partitions: not on the admin port (use --metadata URL)")
    else:
        out.append(f"partitions ({len(s.partitions)}): topic-partition leader@epoch")
        by_topic: dict[str, list[str]] = defaultdict(list)
        for t, p, n, e in s.partitions:
            by_topic[t].append(f"{p}:{n if n != NO_LEADER else 'none'}@{e}")
        out += [f"  {t}  {' '.join(v)}" for t, v in sorted(by_topic.items())]
    if s.pins is not None:
        out.append(f"pinned partitions ({len(s.pins)}, AlterPartitionReassignments):"
                   " topic-partition -> broker")
        for t, p, n, target in s.pins:
            state = "done" if n == target else (
                f"moving: leader now {n if n != NO_LEADER else 'none'}")
            out.append(f"  {t}-{p} -> {target} ({state})")
    slots: dict[int, list[int]] = defaultdict(list)
    for slot, n in sorted(s.slots.items()):
        slots[n].append(slot)
    out.append(f"group coordinator slots ({COORDINATOR_SLOTS}, crc32(group) % "
               f"{COORDINATOR_SLOTS}): node: slots")
    out += [f"  {n if n != NO_LEADER else 'none'}: {len(v)} ({_ranges(v)})"
            for n, v in sorted(slots.items())]
    return "\n".join(out)


def as_json(s: ClusterStatus) -> dict[str, Any]:
    return {"controller": s.controller, "now_ms": s.now_ms,
            "brokers": [
                {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
                 "lease_expires_ms": b.lease_expires_ms, "live": b.live} for b in s.brokers],
            "partitions": None if s.partitions is None else [
                {"topic": t, "partition": p, "leader": n, "leader_epoch": e}
                for t, p, n, e in s.partitions],
            "coordinator_slots": {str(k): v for k, v in s.slots.items()},
            "pinned": None if s.pins is None else [
                {"topic": t, "partition": p, "leader": n, "target": target,
                 "done": n == target} for t, p, n, target in s.pins]}


def _ranges(values: list[int]) -> str:
    spans: list[str] = []
    for v in values:
        if spans and spans[-1].split("-")[-1] == str(v - 1):
            spans[-1] = f"{spans[-1].split('-')[0]}-{v}"
        else:
            spans.append(str(v))
    return ",".join(spans)
