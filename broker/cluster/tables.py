"""The cluster's rows in the metadata database, changed only in its transactions (run on the
store's thread; see s3stream.metadata.base): registrations with leases (`kafka_brokers`),
the controller (kafka_meta['controller']), partition leaders and epochs (`kafka_partitions`).
Tables: broker.metadata.schema, migration 2. Times are ms since the epoch, each broker's clock.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from broker.cluster.assignment import assign
from broker.cluster.model import NO_LEADER, BrokerInfo, ClusterView, Leader, Snapshot
from broker.metadata import PartitionRow, TopicRow
from s3stream.metadata.backend import Connection


@dataclass(frozen=True)
class Me:
    """This broker process: who it is and how long a lease lasts."""

    node_id: int
    incarnation: str
    rack: str | None
    session_timeout_ms: int


def new_incarnation() -> str:
    return uuid.uuid4().hex


def register(db: Connection, me: Me, now_ms: int) -> None:
    """Register (again) under our node id with a fresh lease. Partitions an earlier process of
    the same node id led get a new epoch: that process is fenced, this one takes them over."""
    db.execute(
        "INSERT INTO kafka_brokers(node_id, host, port, rack, incarnation, lease_expires_ms)"
        " VALUES (?,?,?,?,?,?) ON CONFLICT (node_id) DO UPDATE SET host=excluded.host,"
        " port=excluded.port, rack=excluded.rack, incarnation=excluded.incarnation,"
        " lease_expires_ms=excluded.lease_expires_ms",
        (me.node_id, "", 0, me.rack, me.incarnation, now_ms + me.session_timeout_ms))
    db.execute("UPDATE kafka_partitions SET leader_epoch=leader_epoch+1 WHERE leader=?",
               (me.node_id,))


def advertise(db: Connection, me: Me, host: str, port: int) -> None:
    db.execute("UPDATE kafka_brokers SET host=?, port=? WHERE node_id=? AND incarnation=?",
               (host, port, me.node_id, me.incarnation))


def _live(db: Connection, now_ms: int) -> dict[int, tuple[BrokerInfo, str]]:
    return {int(n): (BrokerInfo(int(n), h, int(p), r), inc) for n, h, p, r, inc in db.execute(
        "SELECT node_id, host, port, rack, incarnation FROM kafka_brokers"
        " WHERE lease_expires_ms > ? ORDER BY node_id", (now_ms,))}


def _controller(db: Connection, me: Me, live: dict[int, tuple[BrokerInfo, str]],
                for_update: str) -> int:
    """The controller's node id; this broker becomes it when the holder is not live."""
    (value,) = db.execute(f"SELECT value FROM kafka_meta WHERE key='controller'{for_update}"
                          ).fetchone()
    node, _, inc = str(value).partition(" ")
    if node.lstrip("-").isdigit() and int(node) in live and live[int(node)][1] == inc:
        return int(node)
    db.execute("UPDATE kafka_meta SET value=? WHERE key='controller'",
               (f"{me.node_id} {me.incarnation}",))
    return me.node_id


def _leaders(db: Connection) -> tuple[dict[int, Leader], dict[int, int]]:
    """Every partition's leader, and the pinned ones' target broker, by stream id."""
    current: dict[int, Leader] = {}
    pins: dict[int, int] = {}
    for s, n, e, target in db.execute("SELECT stream_id, leader, leader_epoch, target_leader"
                                      " FROM kafka_partitions ORDER BY stream_id"):
        current[int(s)] = Leader(int(n), int(e))
        if int(target) != NO_LEADER:
            pins[int(s)] = int(target)
    return current, pins


def _reassign(db: Connection, me: Me, live: dict[int, tuple[BrokerInfo, str]]) -> None:
    """The controller's work: leaders over the brokers that can be reached (an address
    announced; this broker always), pinned partitions on their live target, each change a
    compare-and-set on leader and epoch, in stream id order (the order commits lock partition
    rows in)."""
    current, pinned = _leaders(db)
    eligible = {n for n, (b, _) in live.items() if b.port > 0} | {me.node_id}
    changes = assign(eligible, current, pinned)
    db.executemany(
        "UPDATE kafka_partitions SET leader=?, leader_epoch=? WHERE stream_id=? AND leader=?"
        " AND leader_epoch=?",
        [(new.node_id, new.epoch, sid, current[sid].node_id, current[sid].epoch)
         for sid, new in sorted(changes.items())])


def heartbeat(db: Connection, me: Me, now_ms: int, for_update: str) -> Snapshot:
    """One heartbeat: renew the lease; be the controller if there is none alive (and then
    assign leaders); read leaders, live brokers and topics. Inside one write transaction."""
    renewed = db.execute("UPDATE kafka_brokers SET lease_expires_ms=? WHERE node_id=? AND"
                         " incarnation=?", (now_ms + me.session_timeout_ms, me.node_id,
                                            me.incarnation)).rowcount
    live = _live(db, now_ms)
    controller = NO_LEADER
    if renewed:
        controller = _controller(db, me, live, for_update)
        if controller == me.node_id:
            _reassign(db, me, live)
    topics = [TopicRow(name, uuid.UUID(tid), json.loads(cfg)) for name, tid, cfg
              in db.execute("SELECT name, topic_id, configs FROM kafka_topics")]
    rows = db.execute("SELECT topic, partition, stream_id, leader, leader_epoch"
                      " FROM kafka_partitions ORDER BY topic, partition").fetchall()
    view = ClusterView(
        brokers=tuple(b for b, _ in live.values() if b.port > 0),
        controller=controller,
        leaders={int(s): Leader(int(n), int(e)) for _, _, s, n, e in rows})
    return Snapshot(bool(renewed), view, topics,
                    [PartitionRow(t, int(p), int(s)) for t, p, s, _, _ in rows])


def leave(db: Connection, me: Me) -> int:
    """Graceful shutdown: give up our partitions (new epochs, no leader: the controller places
    them at once), the controller role and the lease. Returns how many partitions."""
    if not db.execute("SELECT 1 FROM kafka_brokers WHERE node_id=? AND incarnation=?",
                      (me.node_id, me.incarnation)).fetchone():
        return 0  # a newer process of this node id registered: not ours to give up
    released = db.execute("UPDATE kafka_partitions SET leader=?, leader_epoch=leader_epoch+1"
                          " WHERE leader=?", (NO_LEADER, me.node_id)).rowcount
    db.execute("UPDATE kafka_meta SET value='' WHERE key='controller' AND value=?",
               (f"{me.node_id} {me.incarnation}",))
    db.execute("UPDATE kafka_brokers SET lease_expires_ms=0 WHERE node_id=? AND incarnation=?",
               (me.node_id, me.incarnation))
    return int(released)


@dataclass(frozen=True)
class Pin:
    """A partition pinned to a broker by AlterPartitionReassignments, and its leader now."""

    topic: str
    partition: int
    leader: int
    target: int

    @property
    def done(self) -> bool:
        return self.leader == self.target


def pins(db: Connection) -> list[Pin]:
    """Every pinned partition, in topic and partition order."""
    return [Pin(str(t), int(p), int(n), int(target)) for t, p, n, target in db.execute(
        "SELECT topic, partition, leader, target_leader FROM kafka_partitions"
        " WHERE target_leader <> ? ORDER BY topic, partition", (NO_LEADER,))]


class PinError(Exception):
    """A reassignment refused: `reason` is 'unknown' (no such topic or partition), 'broker'
    (no broker registered with that node id) or 'none' (a cancel with nothing pinned)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def pin(db: Connection, topic: str, partition: int, target: int | None) -> None:
    """Pin the partition's leader to broker `target` (the controller moves it there at its
    next heartbeat while that broker is live), or with None cancel its pin. Raises PinError."""
    row = db.execute("SELECT target_leader FROM kafka_partitions WHERE topic=? AND"
                     " partition=?", (topic, partition)).fetchone()
    if row is None:
        raise PinError("unknown", f"no partition {topic}-{partition}")
    if target is None:
        if int(row[0]) == NO_LEADER:
            raise PinError("none", f"no reassignment of {topic}-{partition} to cancel")
    elif not db.execute("SELECT 1 FROM kafka_brokers WHERE node_id=?", (target,)).fetchone():
        raise PinError("broker", f"the reassignment of {topic}-{partition} names broker"
                       f" {target}, but no such broker is registered")
    db.execute("UPDATE kafka_partitions SET target_leader=? WHERE topic=? AND partition=?",
               (NO_LEADER if target is None else target, topic, partition))
