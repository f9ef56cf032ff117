"""What the classic group protocol keeps, what its transitions emit, and the few operations
on one group that every transition shares (find a member, remove one, fence one).

A JoinGroup or SyncGroup that must wait is given a ticket (an int, unique per coordinator).
The transitions in broker/groups/state.py answer waiting requests only through effects naming
that ticket: JoinDone, SyncDone or Failed. JoinTimer tells the driver when to call back so
that a join phase can end on time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker.errors import ErrorCode, KafkaError

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
)

Clock = Callable[[], float]
"""Monotonic seconds: time.monotonic in the broker, a settable value in tests."""


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
    last_seen: float
    assignment: bytes = b""
    join_ticket: int | None = None  # the JoinGroup waiting for the join phase to end
    sync_ticket: int | None = None  # the SyncGroup waiting for the leader's assignment

    def metadata_for(self, protocol: str) -> bytes:
        return next(m for name, m in self.protocols if name == protocol)

    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def fail_waiting(self, code: ErrorCode, why: str | None, out: list[Effect]) -> None:
        """Answer this member's waiting JoinGroup and SyncGroup, if any, with an error."""
        for ticket in (self.join_ticket, self.sync_ticket):
            if ticket is not None:
                out.append(Failed(ticket, self.member_id, code, why))
        self.join_ticket = self.sync_ticket = None


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
    # member ids handed out by MEMBER_ID_REQUIRED -> when forgotten unless used
    pending_ids: dict[str, float] = field(default_factory=dict)
    join_ends_at: float = 0.0  # PreparingRebalance ends by then, rejoined or not
    hold_until: float = 0.0  # the first generation's initial delay: no earlier end

    def common_protocols(self) -> set[str]:
        return set.intersection(*(m.protocol_names() for m in self.members.values()))

    def remove(self, member_id: str, code: ErrorCode, why: str, out: list[Effect]) -> None:
        m = self.members.pop(member_id, None)
        if m is None:
            return
        if m.instance_id is not None and self.static.get(m.instance_id) == member_id:
            del self.static[m.instance_id]
        m.fail_waiting(code, why, out)

    def join_result(self, m: Member) -> JoinResult:
        """The current generation as member `m`'s JoinGroup answer; the leader's carries
        every member's metadata for the chosen protocol."""
        assert self.leader is not None and self.protocol_name is not None
        protocol, everyone = self.protocol_name, m.member_id == self.leader
        members = [
            (o.member_id, o.instance_id, o.metadata_for(protocol)) for o in self.members.values()
        ]
        return JoinResult(
            self.generation,
            self.protocol_type,
            protocol,
            self.leader,
            m.member_id,
            members if everyone else [],
        )

    def sync_done(self, ticket: int, m: Member) -> SyncDone:
        """The answer to member `m`'s SyncGroup `ticket`: its assignment."""
        return SyncDone(ticket, m.member_id, m.assignment, self.protocol_type, self.protocol_name)

    def fence(self, old_id: str, new_id: str, out: list[Effect]) -> None:
        """A static member rejoined without its member id: its old incarnation is fenced."""
        old = self.members.pop(old_id, None)
        if old is not None:
            old.fail_waiting(ErrorCode.fenced_instance_id, None, out)
            if self.leader == old_id:
                self.leader = new_id


def find_member(
    groups: dict[str, Group], group_id: str, member_id: str, instance_id: str | None
) -> tuple[Group, Member]:
    """The group and member a request comes from, or Kafka's error: FENCED_INSTANCE_ID for a
    group.instance.id now held by another member id, else UNKNOWN_MEMBER_ID."""
    g = groups.get(group_id)
    holder = g.static.get(instance_id, member_id) if g is not None and instance_id else member_id
    if holder != member_id:
        raise KafkaError(ErrorCode.fenced_instance_id, f"instance {instance_id} fenced")
    if g is None or member_id not in g.members:
        raise KafkaError(ErrorCode.unknown_member_id, f"unknown member {member_id}")
    return g, g.members[member_id]


@dataclass(frozen=True)
class JoinResult:
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    member_id: str
    members: list[tuple[str, str | None, bytes]]  # for the leader only


@dataclass(frozen=True)
class JoinDone:
    """Answer the waiting JoinGroup `ticket` with `result`."""

    ticket: int
    result: JoinResult


@dataclass(frozen=True)
class SyncDone:
    """Answer the waiting SyncGroup `ticket` with this member's assignment."""

    ticket: int
    member_id: str
    assignment: bytes
    protocol_type: str | None
    protocol_name: str | None


@dataclass(frozen=True)
class Failed:
    """Answer the waiting JoinGroup or SyncGroup `ticket` with an error."""

    ticket: int
    member_id: str
    code: ErrorCode
    message: str | None = None

    def error(self) -> KafkaError:
        return KafkaError(self.code, self.message)


@dataclass(frozen=True)
class JoinTimer:
    """Call back at `at` (clock time) to end group `group_id`'s join phase; None: no call."""

    group_id: str
    at: float | None


Effect = JoinDone | SyncDone | Failed | JoinTimer


class MemberIdRequired(KafkaError):
    """JoinGroup v4+ without a member id: the client must rejoin with this one."""

    def __init__(self, member_id: str) -> None:
        super().__init__(ErrorCode.member_id_required, "rejoin with the given member id")
        self.member_id = member_id
