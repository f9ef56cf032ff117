"""Brokers sharing one object store and one metadata database (issue 12).

No consensus of its own: registrations with leases, the controller, and partition leaders with
leader epochs are rows in the metadata database, changed in its transactions.
- .model: settings, brokers, leaders, a heartbeat's view;
- .assignment: the pure placement of partitions over live brokers (the controller's rule),
  honouring partitions pinned by AlterPartitionReassignments;
- .tables: the SQL (register, heartbeat, leave, pins);
- .guard: `LeaderGuard`, the fence every change to a partition's log carries;
- .coordinators: where a group (or transactional id) is coordinated;
- .groupguard: offset commits fenced by the group's coordinator epoch;
- .node: `ClusterNode`, this broker's lease, heartbeat loop and held partitions.
"""

from __future__ import annotations

from broker.cluster.model import (
    NO_LEADER,
    BrokerInfo,
    ClusterSettings,
    ClusterView,
    Leader,
    Snapshot,
)
from broker.cluster.node import ClusterNode

__all__ = [
    "NO_LEADER",
    "BrokerInfo",
    "ClusterNode",
    "ClusterSettings",
    "ClusterView",
    "Leader",
    "Snapshot",
]
