"""Questions other APIs ask the group protocol's state (OffsetCommit, OffsetDelete,
DeleteGroups); pure reads of the groups, apart from deleting an empty one."""

from __future__ import annotations

from broker.errors import ErrorCode, KafkaError
from broker.groups.model import COMPLETING, Group, find_member
from broker.protocol.consumer import subscription_topics


def is_active(groups: dict[str, Group], group_id: str) -> bool:
    g = groups.get(group_id)
    return g is not None and bool(g.members)


def check_commit(
    groups: dict[str, Group],
    group_id: str,
    generation: int,
    member_id: str,
    instance_id: str | None,
) -> None:
    """Raise unless an OffsetCommit with this identity is allowed now (Kafka's rules): a
    commit outside group management (generation < 0, no member id) needs a group with no
    member; a member's needs its generation and no assignment under way."""
    g = groups.get(group_id)
    if generation < 0 and not member_id:
        if g is not None and g.members:
            raise KafkaError(ErrorCode.unknown_member_id, "simple commits need an empty group")
        return
    g, _m = find_member(groups, group_id, member_id, instance_id)
    if generation != g.generation:
        raise KafkaError(ErrorCode.illegal_generation)
    if g.state == COMPLETING:
        raise KafkaError(ErrorCode.rebalance_in_progress)


def subscribed_topics(groups: dict[str, Group], group_id: str) -> set[str]:
    """Topics a consumer group's members subscribe to (their first protocol's metadata)."""
    g = groups.get(group_id)
    if g is None or g.protocol_type != "consumer":
        return set()
    topics: set[str] = set()
    for m in g.members.values():
        if m.protocols:
            topics |= subscription_topics(m.protocols[0][1])
    return topics


def delete(groups: dict[str, Group], group_id: str) -> None:
    """DeleteGroups: only a group with no member may go (NON_EMPTY_GROUP otherwise)."""
    g = groups.get(group_id)
    if g is not None and g.members:
        raise KafkaError(ErrorCode.non_empty_group, f"group {group_id} has members")
    groups.pop(group_id, None)
