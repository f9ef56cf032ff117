"""The classic group protocol as a state machine, free of wire types.

States: Empty -> PreparingRebalance -> CompletingRebalance -> Stable (-> PreparingRebalance ...).
A join moves the group to PreparingRebalance; the join phase ends when every known member has
rejoined (or the rebalance timeout passes: the laggards are dropped); the leader then gets every
member's metadata, and its SyncGroup hands each member its assignment. Members that stop
heartbeating for their session timeout are removed, which starts a rebalance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from broker.errors import ErrorCode, KafkaError
from broker.protocol.consumer import subscription_topics

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
)


@dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_seen: float = field(default_factory=time.monotonic)
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[bytes] | None = None

    def metadata_for(self, protocol: str) -> bytes:
        return next(m for name, m in self.protocols if name == protocol)


@dataclass(frozen=True)
class JoinResult:
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    member_id: str
    members: list[tuple[str, str | None, bytes]]  # for the leader only


@dataclass(eq=False)
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_ids: set[str] = field(default_factory=set)  # handed out by MEMBER_ID_REQUIRED
    join_deadline: float = 0.0
    initial_delay_until: float = 0.0
    timer: asyncio.TimerHandle | None = None


class GroupCoordinator:
    def __init__(
        self,
        initial_delay_s: float = 0.3,
        min_session_s: float = 6.0,
        max_session_s: float = 1800.0,
    ) -> None:
        self.groups: dict[str, Group] = {}
        self.initial_delay_s = initial_delay_s
        self.min_session_s = min_session_s
        self.max_session_s = max_session_s
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._expire_loop(), name="group-session-reaper")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper

    # -- JoinGroup -------------------------------------------------------------------------
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
        g = self.groups.setdefault(group_id, Group(group_id))
        if g.members and (protocol_type != g.protocol_type or not self._compatible(g, protocols)):
            raise KafkaError(
                ErrorCode.inconsistent_group_protocol,
                "protocol type or protocols do not match the group's",
            )
        if not member_id:
            if instance_id is not None and instance_id in g.static:
                old = g.static[instance_id]
                member_id = f"{client_id}-{uuid.uuid4()}"
                self._fence(g, old, member_id)
            else:
                member_id = f"{client_id}-{uuid.uuid4()}"
                if require_known_member_id and instance_id is None:
                    g.pending_ids.add(member_id)
                    raise MemberIdRequired(member_id)
        elif member_id not in g.members and member_id not in g.pending_ids:
            raise KafkaError(ErrorCode.unknown_member_id, f"unknown member {member_id}")
        elif instance_id is not None and g.static.get(instance_id, member_id) != member_id:
            raise KafkaError(ErrorCode.fenced_instance_id, f"instance {instance_id} fenced")
        g.pending_ids.discard(member_id)
        m = g.members.get(member_id)
        if m is None:
            m = Member(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_timeout_s,
                rebalance_timeout_s,
                protocol_type,
                protocols,
            )
            g.members[member_id] = m
            if instance_id is not None:
                g.static[instance_id] = member_id
        else:
            m.protocols, m.session_timeout_s = protocols, session_timeout_s
            m.rebalance_timeout_s = rebalance_timeout_s
        m.last_seen = time.monotonic()
        if m.join_future is not None and not m.join_future.done():
            m.join_future.set_exception(KafkaError(ErrorCode.rebalance_in_progress))
        fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        m.join_future = fut
        g.protocol_type = protocol_type
        if g.state != PREPARING:
            self._prepare_rebalance(g)
        self._maybe_complete_join(g)
        return await fut

    def _compatible(self, g: Group, protocols: list[tuple[str, bytes]]) -> bool:
        names = {n for n, _ in protocols}
        common = set.intersection(*({n for n, _ in m.protocols} for m in g.members.values()))
        return bool(names & common)

    def _fence(self, g: Group, old_id: str, new_id: str) -> None:
        old = g.members.pop(old_id, None)
        if old is not None:
            self._fail_pending(old, KafkaError(ErrorCode.fenced_instance_id))
            if g.leader == old_id:
                g.leader = new_id

    def _prepare_rebalance(self, g: Group) -> None:
        initial = g.state == EMPTY
        g.state = PREPARING
        for m in g.members.values():
            if m.sync_future is not None and not m.sync_future.done():
                m.sync_future.set_exception(KafkaError(ErrorCode.rebalance_in_progress))
        timeout = max((m.rebalance_timeout_s for m in g.members.values()), default=1.0)
        now = time.monotonic()
        g.join_deadline = now + timeout
        delay = min(self.initial_delay_s, timeout) if initial else timeout
        g.initial_delay_until = now + delay if initial else 0.0
        self._arm(g, delay)

    def _arm(self, g: Group, delay: float) -> None:
        if g.timer is not None:
            g.timer.cancel()
        g.timer = asyncio.get_running_loop().call_later(delay, self._on_timer, g)

    def _on_timer(self, g: Group) -> None:
        g.timer = None
        if g.state == PREPARING:
            self._complete_join(g)

    def _maybe_complete_join(self, g: Group) -> None:
        """End the join phase once every member has rejoined, except during the first
        generation's initial delay, which lets members starting together land in one
        generation (Kafka's group.initial.rebalance.delay.ms)."""
        if g.state != PREPARING or time.monotonic() < g.initial_delay_until:
            return
        if all(m.join_future is not None and not m.join_future.done() for m in g.members.values()):
            self._complete_join(g)

    def _complete_join(self, g: Group) -> None:
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        for mid in [
            mid for mid, m in g.members.items() if m.join_future is None or m.join_future.done()
        ]:
            self._remove(g, mid, KafkaError(ErrorCode.unknown_member_id, "did not rejoin"))
        g.generation += 1
        if not g.members:
            g.state, g.protocol_name, g.leader = EMPTY, None, None
            return
        votes: Counter[str] = Counter()
        common = set.intersection(*({n for n, _ in m.protocols} for m in g.members.values()))
        for m in g.members.values():
            votes[next(n for n, _ in m.protocols if n in common)] += 1
        g.protocol_name = votes.most_common(1)[0][0]
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        everyone = [
            (m.member_id, m.instance_id, m.metadata_for(g.protocol_name))
            for m in g.members.values()
        ]
        for m in g.members.values():
            assert m.join_future is not None and g.leader is not None
            m.assignment = b""
            m.join_future.set_result(
                JoinResult(
                    g.generation,
                    g.protocol_type,
                    g.protocol_name,
                    g.leader,
                    m.member_id,
                    everyone if m.member_id == g.leader else [],
                )
            )

    # -- SyncGroup / Heartbeat / LeaveGroup ------------------------------------------------
    def _member(
        self, group_id: str, member_id: str, instance_id: str | None
    ) -> tuple[Group, Member]:
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            if g is not None and instance_id is not None and instance_id in g.static:
                raise KafkaError(ErrorCode.fenced_instance_id, f"instance {instance_id} fenced")
            raise KafkaError(ErrorCode.unknown_member_id, f"unknown member {member_id}")
        return g, g.members[member_id]

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[bytes, str | None, str | None]:
        g, m = self._member(group_id, member_id, instance_id)
        if generation != g.generation:
            raise KafkaError(ErrorCode.illegal_generation, f"generation {generation} is stale")
        m.last_seen = time.monotonic()
        if g.state == PREPARING:
            raise KafkaError(ErrorCode.rebalance_in_progress)
        if g.state == STABLE:
            return m.assignment, g.protocol_type, g.protocol_name
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        m.sync_future = fut
        if member_id == g.leader:
            for mid, other in g.members.items():
                other.assignment = assignments.get(mid, b"")
            g.state = STABLE
            for other in g.members.values():
                if other.sync_future is not None and not other.sync_future.done():
                    other.sync_future.set_result(other.assignment)
        return await fut, g.protocol_type, g.protocol_name

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> None:
        g, m = self._member(group_id, member_id, instance_id)
        m.last_seen = time.monotonic()
        if generation != g.generation:
            raise KafkaError(ErrorCode.illegal_generation)
        if g.state == PREPARING:
            raise KafkaError(ErrorCode.rebalance_in_progress)

    def leave(self, group_id: str, member_id: str, instance_id: str | None) -> None:
        g = self.groups.get(group_id)
        if instance_id is not None and g is not None and not member_id:
            member_id = g.static.get(instance_id, "")
        g, _m = self._member(group_id, member_id, instance_id)
        self._remove(g, member_id, KafkaError(ErrorCode.unknown_member_id, "left the group"))
        self._after_membership_change(g)

    def _remove(self, g: Group, member_id: str, why: KafkaError) -> None:
        m = g.members.pop(member_id, None)
        if m is None:
            return
        if m.instance_id is not None and g.static.get(m.instance_id) == member_id:
            del g.static[m.instance_id]
        self._fail_pending(m, why)

    def _fail_pending(self, m: Member, why: KafkaError) -> None:
        for f in (m.join_future, m.sync_future):
            if f is not None and not f.done():
                f.set_exception(why)

    def _after_membership_change(self, g: Group) -> None:
        if g.state in (STABLE, COMPLETING):
            if g.members:
                self._prepare_rebalance(g)
            else:
                g.state, g.generation = EMPTY, g.generation + 1
                g.leader = g.protocol_name = None
        elif g.state == PREPARING:
            if g.members:
                self._maybe_complete_join(g)
            else:
                self._complete_join(g)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for g in list(self.groups.values()):
                expired = [
                    m.member_id
                    for m in g.members.values()
                    if (m.join_future is None or m.join_future.done())
                    and now - m.last_seen > m.session_timeout_s
                ]
                for mid in expired:
                    log.info("group %s: member %s session expired", g.group_id, mid)
                    self._remove(g, mid, KafkaError(ErrorCode.unknown_member_id, "expired"))
                if expired:
                    self._after_membership_change(g)

    # -- queries ---------------------------------------------------------------------------
    def is_active(self, group_id: str) -> bool:
        g = self.groups.get(group_id)
        return g is not None and bool(g.members)

    def check_commit(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> None:
        """Raise unless a commit with this identity is allowed now (Kafka's rules)."""
        g = self.groups.get(group_id)
        if generation < 0 and not member_id:
            if g is not None and g.members:
                raise KafkaError(ErrorCode.unknown_member_id, "simple commits need an empty group")
            return
        g, _m = self._member(group_id, member_id, instance_id)
        if generation != g.generation:
            raise KafkaError(ErrorCode.illegal_generation)
        if g.state == COMPLETING:
            raise KafkaError(ErrorCode.rebalance_in_progress)

    def subscribed_topics(self, group_id: str) -> set[str]:
        g = self.groups.get(group_id)
        if g is None or g.protocol_type != "consumer":
            return set()
        topics: set[str] = set()
        for m in g.members.values():
            if m.protocols:
                topics |= subscription_topics(m.protocols[0][1])
        return topics

    def delete(self, group_id: str) -> None:
        g = self.groups.get(group_id)
        if g is not None and g.members:
            raise KafkaError(ErrorCode.non_empty_group, f"group {group_id} has members")
        self.groups.pop(group_id, None)


class MemberIdRequired(KafkaError):
    def __init__(self, member_id: str) -> None:
        super().__init__(ErrorCode.member_id_required, "rejoin with the given member id")
        self.member_id = member_id
