"""The brokers a broker knows of, for /status and the console: itself and, when brokers share
the metadata database (broker/cluster/), every live one (its lease held at the last heartbeat),
the controller, and how many partitions each leads."""

from __future__ import annotations

from typing import Any

from broker.cluster import ClusterView


def brokers_report(node_id: int, host: str, port: int,
                   view: ClusterView | None) -> list[dict[str, Any]]:
    """[{node_id, host, port, rack, this, controller, partitions_led}], by node id."""
    if view is None or not view.brokers:
        return [{"node_id": node_id, "host": host, "port": port, "rack": None, "this": True,
                 "controller": True, "partitions_led": None}]
    led: dict[int, int] = {}
    for leader in view.leaders.values():
        led[leader.node_id] = led.get(leader.node_id, 0) + 1
    return [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
             "this": b.node_id == node_id, "controller": b.node_id == view.controller,
             "partitions_led": led.get(b.node_id, 0)}
            for b in sorted(view.brokers, key=lambda b: b.node_id)]
