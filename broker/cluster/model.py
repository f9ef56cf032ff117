"""What the cluster layer hands out: settings, brokers, leaders, one tick's view."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.metadata import PartitionRow, TopicRow

NO_LEADER = -1


@dataclass(frozen=True)
class ClusterSettings:
    """`node.id`, `broker.rack`, `broker.heartbeat.interval.ms`, `broker.session.timeout.ms`:
    a broker renews its lease every heartbeat; one whose lease (session timeout) ran out is
    dead and its partitions go to live brokers."""

    node_id: int = 0
    rack: str | None = None
    heartbeat_interval_ms: int = 500
    # 2000: a dead broker's partitions are writable again in ~2-2.5 s, and clients (whose
    # metadata retries back off up to 1 s) produce again within the 5 s target
    session_timeout_ms: int = 2000


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class Leader:
    node_id: int  # NO_LEADER: none
    epoch: int


@dataclass(frozen=True)
class ClusterView:
    """The live brokers (those that have announced an address), the controller, and every
    partition's leader by its stream id, as of the last heartbeat."""

    brokers: tuple[BrokerInfo, ...] = ()
    controller: int = NO_LEADER
    leaders: Mapping[int, Leader] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One heartbeat's reading of the metadata database (one transaction)."""

    registered: bool  # False: another process registered with this node id since
    view: ClusterView
    topics: list[TopicRow]
    partitions: list[PartitionRow]
