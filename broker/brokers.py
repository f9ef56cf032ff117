"""The brokers a broker knows of, for /status and the console: itself and, when brokers share
the metadata database (broker/cluster/), every live one (its lease held at the last heartbeat),
the controller, how many partitions each leads, and when each one's lease runs out (`Leases`:
read from `kafka_brokers` every second in the background, so /status never waits on the
database)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from broker.cluster import ClusterView
from s3stream.metadata.base import StoreBase

log = logging.getLogger(__name__)


class Leases:
    """Every registered broker's lease expiry (ms since the epoch, by node id), as last read."""

    def __init__(self, store: StoreBase, interval_s: float = 1.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self.expires_ms: dict[int, int] = {}

    def _read(self) -> dict[int, int]:
        with self.store._txn(read_only=True) as db:
            return {int(n): int(e) for n, e in db.execute(
                "SELECT node_id, lease_expires_ms FROM kafka_brokers")}

    async def refresh(self) -> None:
        self.expires_ms = await self.store._run(self._read)

    async def run(self) -> None:
        """Refresh every `interval_s`, forever (a failed read keeps the last one)."""
        while True:
            try:
                await self.refresh()
            except Exception as e:  # the metadata database's health is reported elsewhere
                log.debug("broker leases not read: %s", e)
            await asyncio.sleep(self.interval_s)


def brokers_report(node_id: int, host: str, port: int, view: ClusterView | None,
                   leases: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """[{node_id, host, port, rack, this, controller, partitions_led, lease_expires_ms,
    lease_remaining_s}], by node id (the lease fields None when not read yet)."""
    now_ms = time.time() * 1000

    def lease(n: int) -> dict[str, Any]:
        until = (leases or {}).get(n)
        return {"lease_expires_ms": until,
                "lease_remaining_s": None if until is None else round((until - now_ms) / 1000, 3)}

    if view is None or not view.brokers:
        return [{"node_id": node_id, "host": host, "port": port, "rack": None, "this": True,
                 "controller": True, "partitions_led": None, **lease(node_id)}]
    led: dict[int, int] = {}
    for leader in view.leaders.values():
        led[leader.node_id] = led.get(leader.node_id, 0) + 1
    return [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
             "this": b.node_id == node_id, "controller": b.node_id == view.controller,
             "partitions_led": led.get(b.node_id, 0), **lease(b.node_id)}
            for b in sorted(view.brokers, key=lambda b: b.node_id)]
