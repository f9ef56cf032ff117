"""The classic group protocol as pure state transitions: no asyncio, time from a Clock.

States: Empty -> PreparingRebalance -> CompletingRebalance -> Stable (-> PreparingRebalance ...).
A join moves the group to PreparingRebalance; the join phase ends when every known member has
rejoined (or the rebalance timeout passes: the laggards are dropped); the leader then gets every
member's metadata, and its SyncGroup hands each member its assignment. Members that stop
heartbeating for their session timeout are removed, which starts a rebalance.

Each transition either raises KafkaError before changing anything (the request is answered
with that error at once) or returns the effects the driver (broker/groups/coordinator.py) must
apply: answers to waiting JoinGroup / SyncGroup requests and the join-phase timer. Error codes
and their order follow Kafka's GroupCoordinator.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections import Counter
from typing import NamedTuple

from broker.errors import ErrorCode, KafkaError
from broker.groups.model import (
    COMPLETING,
    EMPTY,
    PREPARING,
    STABLE,
    Clock,
    Effect,
    Failed,
    Group,
    JoinDone,
    JoinTimer,
    Member,
    MemberIdRequired,
    find_member,
)

log = logging.getLogger("broker.groups.coordinator")


class Wait(NamedTuple):
    """A JoinGroup / SyncGroup accepted: its answer is the effect naming `ticket` (possibly
    among `effects` already)."""

    member_id: str
    ticket: int
    effects: list[Effect]


class GroupTable:
    def __init__(
        self,
        clock: Clock,
        initial_delay_s: float = 0.3,
        min_session_s: float = 6.0,
        max_session_s: float = 1800.0,
    ) -> None:
        self.groups: dict[str, Group] = {}
        self.clock = clock
        self.initial_delay_s = initial_delay_s
        self.min_session_s = min_session_s
        self.max_session_s = max_session_s
        self._tickets = itertools.count(1)

    # -- JoinGroup -------------------------------------------------------------------------
    def join(
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
    ) -> Wait:
        if not group_id:
            raise KafkaError(ErrorCode.invalid_group_id, "empty group id")
        if not self.min_session_s <= session_timeout_s <= self.max_session_s:
            raise KafkaError(
                ErrorCode.invalid_session_timeout,
                f"session timeout {session_timeout_s}s outside "
                f"[{self.min_session_s}, {self.max_session_s}]",
            )
        if not protocols:
            raise KafkaError(ErrorCode.inconsistent_group_protocol, "no protocols")
        g = self.groups.get(group_id) or Group(group_id)
        if g.members and (
            protocol_type != g.protocol_type or not {n for n, _ in protocols} & g.common_protocols()
        ):
            raise KafkaError(
                ErrorCode.inconsistent_group_protocol,
                "protocol type or protocols do not match the group's",
            )
        now = self.clock()
        out: list[Effect] = []
        if member_id:
            if instance_id is not None and g.static.get(instance_id, member_id) != member_id:
                raise KafkaError(ErrorCode.fenced_instance_id, f"instance {instance_id} fenced")
            if member_id not in g.members and member_id not in g.pending_ids:
                raise KafkaError(ErrorCode.unknown_member_id, f"unknown member {member_id}")
        else:
            member_id = f"{client_id}-{uuid.uuid4()}"
            self.groups[group_id] = g
            if instance_id is not None and instance_id in g.static:
                g.fence(g.static[instance_id], member_id, out)
            elif require_known_member_id and instance_id is None:
                g.pending_ids[member_id] = now + session_timeout_s  # as Kafka does
                raise MemberIdRequired(member_id)
        self.groups[group_id] = g
        g.pending_ids.pop(member_id, None)
        m = g.members.get(member_id)
        if m is None:
            m = g.members[member_id] = Member(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_timeout_s,
                rebalance_timeout_s,
                protocol_type,
                protocols,
                last_seen=now,
            )
            if instance_id is not None:
                g.static[instance_id] = member_id
        else:
            unchanged = m.protocols == protocols
            m.protocols, m.session_timeout_s = protocols, session_timeout_s
            m.rebalance_timeout_s, m.last_seen = rebalance_timeout_s, now
            if unchanged and (
                g.state == COMPLETING or (g.state == STABLE and member_id != g.leader)
            ):  # a JoinGroup repeated (its answer lost, say): the current generation, as Kafka
                ticket = next(self._tickets)
                return Wait(member_id, ticket, [JoinDone(ticket, g.join_result(m))])
        if m.join_ticket is not None:
            out.append(Failed(m.join_ticket, member_id, ErrorCode.rebalance_in_progress))
        m.join_ticket = ticket = next(self._tickets)
        g.protocol_type = protocol_type
        if g.state != PREPARING:
            self._prepare_rebalance(g, now, out, f"JoinGroup from {member_id}")
        self._maybe_complete_join(g, now, out)
        return Wait(member_id, ticket, out)

    def _prepare_rebalance(self, g: Group, now: float, out: list[Effect], why: str) -> None:
        initial = g.state == EMPTY
        log.info("group %s: preparing to rebalance from %s, generation %d (%s)",
                 g.group_id, g.state, g.generation, why)
        g.state = PREPARING
        for m in g.members.values():
            if m.sync_ticket is not None:
                out.append(Failed(m.sync_ticket, m.member_id, ErrorCode.rebalance_in_progress))
                m.sync_ticket = None
        timeout = max((m.rebalance_timeout_s for m in g.members.values()), default=1.0)
        if initial:  # group.initial.rebalance.delay.ms: members starting together, one generation
            g.hold_until = g.join_ends_at = now + min(self.initial_delay_s, timeout)
        else:
            g.hold_until, g.join_ends_at = 0.0, now + timeout
        out.append(JoinTimer(g.group_id, g.join_ends_at))

    def _maybe_complete_join(self, g: Group, now: float, out: list[Effect]) -> None:
        """End the join phase once every member has rejoined, except during the initial delay."""
        if g.state != PREPARING or now < g.hold_until:
            return
        if all(m.join_ticket is not None for m in g.members.values()):
            self._complete_join(g, now, out)

    def _complete_join(self, g: Group, now: float, out: list[Effect]) -> None:
        out.append(JoinTimer(g.group_id, None))
        for mid in [mid for mid, m in g.members.items() if m.join_ticket is None]:
            log.info("group %s: member %s removed: did not rejoin in time", g.group_id, mid)
            g.remove(mid, ErrorCode.unknown_member_id, "did not rejoin", out)
        g.generation += 1
        if not g.members:
            log.info("group %s: generation %d is empty", g.group_id, g.generation)
            g.state, g.protocol_name, g.leader = EMPTY, None, None
            return
        common = g.common_protocols()
        votes = Counter(next(n for n, _ in m.protocols if n in common) for m in g.members.values())
        g.protocol_name = votes.most_common(1)[0][0]
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        log.info("group %s: generation %d, %d members, leader %s, protocol %s",
                 g.group_id, g.generation, len(g.members), g.leader, g.protocol_name)
        for m in g.members.values():
            assert m.join_ticket is not None
            out.append(JoinDone(m.join_ticket, g.join_result(m)))
            m.join_ticket, m.assignment, m.last_seen = None, b"", now

    # -- SyncGroup / Heartbeat / LeaveGroup ------------------------------------------------
    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> Wait:
        g, m = find_member(self.groups, group_id, member_id, instance_id)
        if generation != g.generation:
            raise KafkaError(ErrorCode.illegal_generation, f"generation {generation} is stale")
        if g.state == PREPARING:
            raise KafkaError(ErrorCode.rebalance_in_progress)
        now = self.clock()
        out: list[Effect] = []
        m.last_seen = now
        ticket = next(self._tickets)
        if g.state == STABLE:
            out.append(g.sync_done(ticket, m))
            return Wait(member_id, ticket, out)
        if m.sync_ticket is not None:  # a repeated SyncGroup replaces the first
            out.append(Failed(m.sync_ticket, member_id, ErrorCode.rebalance_in_progress))
        m.sync_ticket = ticket
        if member_id == g.leader:
            for mid, other in g.members.items():
                other.assignment = assignments.get(mid, b"")
            g.state = STABLE
            log.info("group %s: generation %d stable, assignment from leader %s",
                     g.group_id, g.generation, member_id)
            for other in g.members.values():
                if other.sync_ticket is not None:
                    out.append(g.sync_done(other.sync_ticket, other))
                    other.sync_ticket, other.last_seen = None, now
        return Wait(member_id, ticket, out)

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> None:
        g, m = find_member(self.groups, group_id, member_id, instance_id)
        if generation != g.generation:
            raise KafkaError(ErrorCode.illegal_generation)
        m.last_seen = self.clock()
        if g.state == PREPARING:
            raise KafkaError(ErrorCode.rebalance_in_progress)

    def leave(self, group_id: str, member_id: str, instance_id: str | None) -> list[Effect]:
        g = self.groups.get(group_id)
        if g is not None and member_id in g.pending_ids:
            del g.pending_ids[member_id]  # never joined: nothing else to undo
            return []
        if instance_id is not None and g is not None and not member_id:
            member_id = g.static.get(instance_id, "")
        g, _m = find_member(self.groups, group_id, member_id, instance_id)
        out: list[Effect] = []
        g.remove(member_id, ErrorCode.unknown_member_id, "left the group", out)
        self._after_membership_change(g, self.clock(), out, f"member {member_id} left")
        return out

    def abandon(self, group_id: str, ticket: int) -> None:
        """The request waiting on `ticket` is gone (its connection closed): its member no
        longer counts as rejoined or syncing."""
        g = self.groups.get(group_id)
        for m in g.members.values() if g is not None else ():
            if m.join_ticket == ticket:
                m.join_ticket = None
            if m.sync_ticket == ticket:
                m.sync_ticket = None

    def _after_membership_change(
        self, g: Group, now: float, out: list[Effect], why: str
    ) -> None:
        if g.state in (STABLE, COMPLETING):
            if g.members:
                self._prepare_rebalance(g, now, out, why)
            else:
                g.state, g.generation = EMPTY, g.generation + 1
                g.leader = g.protocol_name = None
        elif g.state == PREPARING:
            if g.members:
                self._maybe_complete_join(g, now, out)
            else:
                self._complete_join(g, now, out)

    # -- time ------------------------------------------------------------------------------
    def advance(self) -> list[Effect]:
        """Act on every deadline passed by now: join phases that must end, sessions that
        expired (a member waiting in JoinGroup or SyncGroup is not expected to heartbeat),
        member ids handed out by MEMBER_ID_REQUIRED and not used within a session timeout."""
        now = self.clock()
        out: list[Effect] = []
        for g in list(self.groups.values()):
            for mid in [mid for mid, until in g.pending_ids.items() if now > until]:
                del g.pending_ids[mid]
            if g.state == PREPARING and now >= g.join_ends_at:
                self._complete_join(g, now, out)
            expired = [
                m.member_id
                for m in g.members.values()
                if m.join_ticket is None
                and m.sync_ticket is None
                and now - m.last_seen > m.session_timeout_s
            ]
            for mid in expired:
                log.info("group %s: member %s session expired", g.group_id, mid)
                g.remove(mid, ErrorCode.unknown_member_id, "session expired", out)
            if expired:
                self._after_membership_change(g, now, out, "sessions expired")
        return out

    def join_deadline(self, group_id: str) -> float | None:
        """When the group's join phase must end, if one is under way."""
        g = self.groups.get(group_id)
        return g.join_ends_at if g is not None and g.state == PREPARING else None
