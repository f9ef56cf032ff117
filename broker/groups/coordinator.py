"""The group coordinator's driver: the futures, timers and session reaper around the pure
state transitions of broker/groups/state.py.

Each request goes to GroupTable; a JoinGroup or SyncGroup that has to wait gets a ticket and a
future, resolved when a transition emits JoinDone / SyncDone / Failed for that ticket. A
JoinTimer effect (re)arms the group's join-phase timer; the reaper calls GroupTable.advance
every REAP_INTERVAL_S so that sessions expire (and any join phase due ends) without a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import TypeVar

from broker.errors import ErrorCode
from broker.groups import queries
from broker.groups.model import (
    Clock,
    Effect,
    Failed,
    Group,
    JoinDone,
    JoinResult,
    JoinTimer,
    MemberIdRequired,
    SyncDone,
)
from broker.groups.state import GroupTable, Wait

__all__ = ["GroupCoordinator", "JoinResult", "MemberIdRequired"]

REAP_INTERVAL_S = 0.25
log = logging.getLogger(__name__)
T = TypeVar("T")


class GroupCoordinator:
    def __init__(
        self,
        initial_delay_s: float = 0.3,
        min_session_s: float = 6.0,
        max_session_s: float = 1800.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.table = GroupTable(clock, initial_delay_s, min_session_s, max_session_s)
        self._joins: dict[int, asyncio.Future[JoinResult]] = {}
        self._syncs: dict[int, asyncio.Future[tuple[bytes, str | None, str | None]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._reaper: asyncio.Task[None] | None = None

    @property
    def groups(self) -> dict[str, Group]:
        return self.table.groups

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap(), name="group-session-reaper")

    async def stop(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper

    # -- requests --------------------------------------------------------------------------
    async def join(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_s: float,
        rebalance_timeout_s: float,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> JoinResult:
        wait = self.table.join(
            group_id,
            member_id,
            instance_id,
            client_id,
            client_host,
            session_timeout_s,
            rebalance_timeout_s,
            protocol_type,
            protocols,
            require_known_member_id,
        )
        return await self._await(group_id, wait, self._joins)

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[bytes, str | None, str | None]:
        """This member's assignment, the protocol type and the protocol name."""
        wait = self.table.sync(group_id, generation, member_id, instance_id, assignments)
        return await self._await(group_id, wait, self._syncs)

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> None:
        self.table.heartbeat(group_id, generation, member_id, instance_id)

    def leave(self, group_id: str, member_id: str, instance_id: str | None) -> None:
        self._apply(self.table.leave(group_id, member_id, instance_id))

    async def _await(self, group_id: str, wait: Wait, pending: dict[int, asyncio.Future[T]]) -> T:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        pending[wait.ticket] = fut
        self._apply(wait.effects)
        try:
            return await fut
        finally:
            if pending.pop(wait.ticket, None) is not None:  # cancelled before its answer
                self.table.abandon(group_id, wait.ticket)

    # -- effects ---------------------------------------------------------------------------
    def _apply(self, effects: Iterable[Effect]) -> None:
        for e in effects:
            if isinstance(e, JoinDone):
                _resolve(self._joins.pop(e.ticket, None), e.result)
            elif isinstance(e, SyncDone):
                answer = (e.assignment, e.protocol_type, e.protocol_name)
                _resolve(self._syncs.pop(e.ticket, None), answer)
            elif isinstance(e, Failed):
                fut = self._joins.pop(e.ticket, None) or self._syncs.pop(e.ticket, None)
                if fut is not None and not fut.done():
                    fut.set_exception(e.error())
            elif isinstance(e, JoinTimer):
                self._arm(e.group_id, e.at)

    def _arm(self, group_id: str, at: float | None) -> None:
        old = self._timers.pop(group_id, None)
        if old is not None:
            old.cancel()
        if at is not None:
            delay = max(0.0, at - self.table.clock())
            loop = asyncio.get_running_loop()
            self._timers[group_id] = loop.call_later(delay, self._on_timer, group_id)

    def _on_timer(self, group_id: str) -> None:
        self._timers.pop(group_id, None)
        self._apply(self.table.advance())
        # a timer may fire a hair before the clock reaches its deadline: call back again
        at = self.table.join_deadline(group_id)
        if at is not None and group_id not in self._timers:
            self._arm(group_id, at)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            try:
                self._apply(self.table.advance())
            except Exception:  # a bug, logged; sessions must go on expiring in every group
                log.exception("group session reaper")

    # -- queries ---------------------------------------------------------------------------
    def is_active(self, group_id: str) -> bool:
        return queries.is_active(self.groups, group_id)

    def check_commit(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> None:
        """Raise unless a commit with this identity is allowed now (Kafka's rules)."""
        queries.check_commit(self.groups, group_id, generation, member_id, instance_id)

    def subscribed_topics(self, group_id: str) -> set[str]:
        return queries.subscribed_topics(self.groups, group_id)

    def delete(self, group_id: str) -> None:
        queries.delete(self.groups, group_id)

    def unload(self, group_id: str) -> None:
        """Forget the group (its coordinator moved to another broker): waiting JoinGroup and
        SyncGroup requests answer NOT_COORDINATOR, so their members find the new one."""
        g = self.groups.pop(group_id, None)
        self._arm(group_id, None)
        out: list[Effect] = []
        for m in g.members.values() if g is not None else ():
            m.fail_waiting(ErrorCode.not_coordinator, "the group's coordinator moved", out)
        self._apply(out)


def _resolve(fut: asyncio.Future[T] | None, value: T) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)
