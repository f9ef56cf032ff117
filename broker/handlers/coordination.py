"""Which broker coordinates a group, for the group handlers (groups.py, group_admin.py,
offsets.py): the placement rule of broker.cluster.coordinators over this broker's cluster view.
"""

from __future__ import annotations

from broker.cluster.coordinators import (
    coordinator_of,
    drop_moved,
    ensure_loaded,
    forget,
    is_local,
)
from broker.cluster.model import BrokerInfo
from broker.errors import ErrorCode, KafkaError
from broker.handlers.base import BrokerContext


def coordinator(ctx: BrokerContext, key: str) -> BrokerInfo | None:
    """The broker FindCoordinator names for a group id (None: no live broker known)."""
    return coordinator_of(key, ctx.storage.cluster_view(), BrokerInfo(
        ctx.node_id, ctx.host, ctx.port, None))


async def here(ctx: BrokerContext, group_id: str) -> bool:
    """True when this broker coordinates the group; first unloads the groups that moved away
    since the last cluster view, and reloads a group's committed offsets from the metadata
    database the first time it is served here (its previous coordinator wrote them), taking
    it over: from then on commits of a previous coordinator are refused."""
    view = ctx.storage.cluster_view()
    drop_moved(ctx.groups, view, ctx.node_id)
    if group_id in ctx.offsets.lost:  # its commit was refused: another broker took it over
        ctx.offsets.lost.discard(group_id)
        forget(ctx.groups, group_id)  # unloaded; taken over again below if placed here
    if not is_local(group_id, view, ctx.node_id):
        return False
    if view is not None:
        try:  # takes the group over (broker.cluster.groupguard): its commits are fenced
            await ensure_loaded(ctx.groups, group_id, lambda: ctx.offsets.reload(group_id))
        except KafkaError as e:  # the database places it elsewhere: this view is stale
            if e.code == ErrorCode.not_coordinator:
                return False
            raise
    return True



async def require_here(ctx: BrokerContext, group_id: str) -> None:
    """Raise NOT_COORDINATOR unless this broker coordinates the group."""
    if not await here(ctx, group_id):
        raise KafkaError(ErrorCode.not_coordinator, f"group {group_id} is coordinated by"
                         " another broker")
