"""Where a group (or a transactional id) is coordinated: a pure rule every broker computes the
same way from its cluster view, so FindCoordinator on any broker names the same one.

A key hashes (CRC-32 of its UTF-8 bytes, so the same in every process) to one of
`COORDINATOR_SLOTS` slots; a slot is coordinated by the live broker with the highest
rendezvous weight for it (BLAKE2b of "slot/node"). A broker's death moves only its own slots
(to the surviving brokers, spread by weight); a broker joining takes about 1/N of the slots.

`GroupPlacement` applies it to this broker's group coordinator: requests for a group placed
elsewhere answer NOT_COORDINATOR, and whenever the view changes, the in-memory state of groups
no longer placed here is dropped (a group that moves starts empty on its new coordinator: its
members rejoin; committed offsets are rows in the shared metadata database already).

Brokers see a change at their own heartbeats (within `broker.heartbeat.interval.ms`): during
that window two brokers may both take a group's requests; the members of the group follow
FindCoordinator to the new coordinator and rejoin there, the old one's state is dropped at its
next heartbeat.
"""

from __future__ import annotations

import asyncio
import hashlib
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from weakref import WeakKeyDictionary

from broker.cluster.model import NO_LEADER, BrokerInfo, ClusterView

COORDINATOR_SLOTS = 50  # like Kafka's default offsets.topic.num.partitions


def slot_of(key: str) -> int:
    """The coordinator slot of a group id or transactional id."""
    return zlib.crc32(key.encode()) % COORDINATOR_SLOTS


def _weight(slot: int, node_id: int) -> int:
    # a well-mixed hash: CRC-32 is linear, its weights for "slot/1", "slot/2", "slot/3"
    # ordered alike in every slot (broker 2 of 1-3 coordinated nothing)
    digest = hashlib.blake2b(f"{slot}/{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def slot_owner(slot: int, nodes: Sequence[int]) -> int:
    """The node coordinating `slot` among the live `nodes` (NO_LEADER: none live)."""
    if not nodes:
        return NO_LEADER
    return max(nodes, key=lambda n: (_weight(slot, n), -n))


def coordinator_of(key: str, view: ClusterView | None, me: BrokerInfo) -> BrokerInfo | None:
    """The broker coordinating `key`: with no cluster view (an engine without a cluster) this
    broker; None while no live broker is known."""
    if view is None:
        return me
    brokers = {b.node_id: b for b in view.brokers}
    if not brokers:
        return me  # not yet advertised: a lone broker coordinates what it is asked about
    owner = slot_owner(slot_of(key), sorted(brokers))
    return brokers.get(owner)


def slot_table(view: ClusterView) -> dict[int, int]:
    """slot -> coordinating node id, for `floe cluster status`."""
    nodes = sorted(b.node_id for b in view.brokers)
    return {s: slot_owner(s, nodes) for s in range(COORDINATOR_SLOTS)}


class Unloadable(Protocol):  # broker.groups.coordinator.GroupCoordinator
    @property
    def groups(self) -> Mapping[str, object]: ...

    def unload(self, group_id: str) -> None: ...


@dataclass
class _Seen:
    view: ClusterView | None = None
    loads: dict[str, asyncio.Future[None]] = field(default_factory=dict)  # by local group


_seen: WeakKeyDictionary[object, _Seen] = WeakKeyDictionary()


def is_local(key: str, view: ClusterView | None, node_id: int) -> bool:
    """True when this broker (`node_id`) coordinates `key` in `view`."""
    if view is None or not view.brokers:
        return True
    return slot_owner(slot_of(key), sorted(b.node_id for b in view.brokers)) == node_id


def drop_moved(groups: Unloadable, view: ClusterView | None, node_id: int) -> list[str]:
    """Once per view: unload the groups placed elsewhere now. Returns their ids."""
    seen = _seen.setdefault(groups, _Seen())
    if view is None or seen.view is view:
        return []
    seen.view = view
    seen.loads = {g: t for g, t in seen.loads.items() if is_local(g, view, node_id)}
    gone = [g for g in list(groups.groups) if not is_local(g, view, node_id)]
    for g in gone:
        groups.unload(g)
    return gone


def forget(groups: Unloadable, group_id: str) -> None:
    """Another broker took the group over (this one's commit was refused): unload it here;
    should it be placed here again, it is taken over (and its offsets read) anew."""
    _seen.setdefault(groups, _Seen()).loads.pop(group_id, None)
    if group_id in groups.groups:
        groups.unload(group_id)


async def ensure_loaded(groups: Unloadable, group_id: str,
                        load: Callable[[], Awaitable[None]]) -> None:
    """Run `load` (reading the group's committed offsets again: its previous coordinator
    wrote them) once per time the group is placed here; requests for the group arriving
    meanwhile wait for the same load (a commit must not be overwritten by an older read)."""
    seen = _seen.setdefault(groups, _Seen())
    task = seen.loads.get(group_id)
    if task is None:
        task = asyncio.ensure_future(load())
        seen.loads[group_id] = task
    try:
        await asyncio.shield(task)
    except Exception:
        if seen.loads.get(group_id) is task:
            del seen.loads[group_id]  # the next request tries again
        raise
