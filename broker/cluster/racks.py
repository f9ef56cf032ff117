"""Read replicas by rack (KIP-392 on shared storage): any live broker can serve reads of any
partition from the object store, so a partition has, besides its leader, one read replica in
each other rack: of the live brokers of that rack, the one the partition's stream id picks
(partitions spread evenly over them). Metadata lists them as the partition's replicas (the
Java consumer fetches only from a listed replica) and the leader names the one of the
consumer's rack as its preferred read replica; both from the same rule and the same view."""

from __future__ import annotations

from collections.abc import Iterable

from broker.cluster.model import BrokerInfo


def rack_replica(brokers: Iterable[BrokerInfo], rack: str, stream_id: int) -> int:
    """The read replica of the stream in `rack` (a node id), -1 when no live broker is there."""
    zone = sorted(b.node_id for b in brokers if b.rack == rack)
    return zone[stream_id % len(zone)] if zone else -1


def read_replicas(brokers: Iterable[BrokerInfo], leader: int, stream_id: int) -> list[int]:
    """The stream's read replicas besides its leader: one per rack other than the leader's,
    in rack order (none for brokers without a rack)."""
    live = list(brokers)
    mine = next((b.rack for b in live if b.node_id == leader), None)
    racks = sorted({b.rack for b in live if b.rack and b.rack != mine})
    return [n for r in racks if (n := rack_replica(live, r, stream_id)) >= 0 and n != leader]
