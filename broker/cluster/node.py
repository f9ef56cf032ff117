"""This broker's membership in the cluster: its registration and lease, the heartbeat loop,
the partitions it serves and at which leader epoch (`held`), and the guards its changes carry.

The heartbeat (every `heartbeat_interval_ms`) is one transaction (broker.cluster.tables):
renew the lease, take the controller role if nobody alive holds it (and then assign leaders),
read leaders, brokers and topics. What it read is handed to the storage engine's `sync`, which
takes the partitions this broker now leads (loading them from the store first) and drops the
others. `lease_valid` is false once the last renewal is older than the session timeout (a
broker paused or cut off from the database): the engine then serves nothing until a heartbeat
renews it (and shows what changed meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING

from broker.cluster import tables
from broker.cluster.guard import LeaderGuard
from broker.cluster.model import ClusterSettings, ClusterView, Snapshot

if TYPE_CHECKING:
    from s3stream.metadata import MetadataStore

log = logging.getLogger(__name__)
LEASE_MARGIN_S = 0.2  # stop serving this much before the lease others see runs out


class ClusterNode:
    def __init__(self, store: MetadataStore, settings: ClusterSettings) -> None:
        self.store = store
        self.settings = settings
        self.me = tables.Me(settings.node_id, tables.new_incarnation(), settings.rack,
                            settings.session_timeout_ms)
        self.held: dict[int, int] = {}  # stream id -> leader epoch, of the partitions served
        self.view = ClusterView()
        # called with every new view, at once (the group coordinator unloads moved groups)
        self.listeners: list[Callable[[ClusterView], object]] = []
        self._lease_until = 0.0  # monotonic
        self._renewed = 0.0  # monotonic start of the last heartbeat that renewed the lease
        self._task: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> int:
        return self.me.node_id

    def lease_valid(self) -> bool:
        return time.monotonic() < self._lease_until

    def serves(self, stream_id: int) -> bool:
        return stream_id in self.held and self.lease_valid()

    async def register(self) -> None:
        await self.store._run(self._in_txn, tables.register, self.me, _now_ms())

    async def advertise(self, host: str, port: int) -> None:
        await self.store._run(self._in_txn, tables.advertise, self.me, host, port)

    async def heartbeat(self) -> Snapshot:
        began = time.monotonic()
        snap, started = await self.store._run(self._heartbeat)
        self._report_late(began, started)
        if not snap.registered:  # another process took our node id: we lead nothing now
            log.error("broker %d: registered by another process (same node.id); this one"
                      " serves nothing", self.node_id)
            self._lease_until = 0.0
            self._set_view(snap.view)
            return snap
        self._lease_until = began + self.settings.session_timeout_ms / 1000 - LEASE_MARGIN_S
        self._renewed = began
        self._set_view(snap.view)
        return snap

    def _report_late(self, began: float, started: float) -> None:
        """Warn when renewals came so far apart that others may have seen this broker's lease
        run out, with where the time went: waiting for the store's thread, or the
        transaction itself (a stalled event loop shows as a gap with neither)."""
        now = time.monotonic()
        if self._renewed and now - self._renewed > self.settings.session_timeout_ms / 2000:
            log.warning("broker %d: lease renewed %.2f s after the last renewal (heartbeat"
                        " sent %.2f s after it, queued %.2f s, transaction %.2f s)",
                        self.node_id, now - self._renewed, began - self._renewed,
                        started - began, now - started)

    def _set_view(self, view: ClusterView) -> None:
        was, now = (sorted(b.node_id for b in v.brokers) for v in (self.view, view))
        if now != was:
            log.info("broker %d: live brokers %s (were %s)", self.node_id, now, was)
        self.view = view
        for listener in self.listeners:
            try:
                listener(view)
            except Exception:
                log.exception("cluster view listener")

    def _heartbeat(self) -> tuple[Snapshot, float]:
        started = time.monotonic()  # on the store's thread
        with self.store._txn() as db:
            return tables.heartbeat(db, self.me, _now_ms(), self.store.for_update), started

    def _in_txn(self, fn: Callable[..., object], *args: object) -> None:
        with self.store._txn() as db:
            fn(db, *args)

    def start(self, sync: Callable[[], Awaitable[None]]) -> None:
        """Run `sync` (a heartbeat and what follows from it) every heartbeat interval."""
        self._task = asyncio.create_task(self._run(sync), name="cluster-heartbeat")

    async def _run(self, sync: Callable[[], Awaitable[None]]) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        due = time.monotonic()
        while True:
            # heartbeats start an interval apart, however long the last one's sync took
            due = max(due + interval, time.monotonic())
            await asyncio.sleep(due - time.monotonic())
            try:
                await sync()
            except Exception as e:
                log.warning("broker %d heartbeat failed: %r", self.node_id, e)

    async def stop(self) -> None:
        """Stop heartbeating, then give up partitions, controller role and lease."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.held.clear()
        try:
            released = 0
            with contextlib.suppress(Exception):
                released = await self.store._run(self._leave)
            log.info("broker %d left the cluster (%d partitions released)", self.node_id,
                     released)
        finally:
            self._lease_until = 0.0

    def _leave(self) -> int:
        with self.store._txn() as db:
            return tables.leave(db, self.me)

    async def reassign(
        self, changes: Sequence[tuple[str, int, int | None]]
    ) -> list[tables.PinError | None]:
        """Pin partitions to brokers (None: cancel the pin), in one transaction; for each
        change its refusal or None. The controller moves them at its next heartbeat."""
        return await self.store._run(self._reassign, changes)

    def _reassign(
        self, changes: Sequence[tuple[str, int, int | None]]
    ) -> list[tables.PinError | None]:
        out: list[tables.PinError | None] = []
        with self.store._txn() as db:
            for topic, partition, target in changes:
                try:
                    tables.pin(db, topic, partition, target)  # raises before it writes
                    out.append(None)
                except tables.PinError as e:
                    out.append(e)
        return out

    async def pins(self) -> list[tables.Pin]:
        """Every pinned partition with its leader now."""
        return await self.store._run(self._pins)

    def _pins(self) -> list[tables.Pin]:
        with self.store._txn(read_only=True) as db:
            return tables.pins(db)

    def guards(self, stream_ids: Collection[int]) -> list[LeaderGuard]:
        """The guard of a change to these streams, with the epochs held now."""
        return [LeaderGuard(self.me.node_id, self.me.incarnation,
                            {s: e for s in stream_ids if (e := self.held.get(s)) is not None},
                            self.store.for_update)]


def _now_ms() -> int:
    return int(time.time() * 1000)
