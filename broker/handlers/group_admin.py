"""FindCoordinator (10), DescribeGroups (15), ListGroups (16), DeleteGroups (42): the group
APIs that ask about or remove groups rather than take part in one (those are in groups.py)."""

from __future__ import annotations

from kio.schema.find_coordinator.v0.request import FindCoordinatorRequest as FindCoordinatorV0
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest as FindCoordinatorV4
from kio.schema.list_groups.v0.request import ListGroupsRequest as ListGroupsV0
from kio.schema.list_groups.v1.request import ListGroupsRequest as ListGroupsV1
from kio.schema.list_groups.v2.request import ListGroupsRequest as ListGroupsV2
from kio.schema.list_groups.v3.request import ListGroupsRequest as ListGroupsV3

from broker.cluster.coordinators import is_local
from broker.errors import ErrorCode, KafkaError
from broker.groups import tablegroups
from broker.handlers.apitypes import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    LIST_GROUPS,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.handlers.coordination import coordinator, here, require_here
from broker.protocol.codec import RequestHead

AUTHORIZED_OPS_OMITTED = -(2**31)


@api(FIND_COORDINATOR, 0, 4)
async def find_coordinator(
    ctx: BrokerContext, head: RequestHead, req: FindCoordinatorRequest
) -> FindCoordinatorResponse:
    key_type = 0 if isinstance(req, FindCoordinatorV0) else req.key_type
    if isinstance(req, FindCoordinatorV4):
        coord = nested(head, "Coordinator")
        return build(
            resp(head, FIND_COORDINATOR),
            throttle_time=ZERO_MS,
            coordinators=tuple(
                build(coord, key=k, **_coordinator(ctx, key_type, k))
                for k in req.coordinator_keys
            ),
        )
    return build(
        resp(head, FIND_COORDINATOR), throttle_time=ZERO_MS, **_coordinator(ctx, key_type, req.key)
    )


def _coordinator(ctx: BrokerContext, key_type: int, key: str) -> dict[str, object]:
    """A group's or a transactional id's coordinator, placed over the live brokers by the
    same rule (broker.cluster.coordinators)."""
    if key_type in (0, 1):
        b = coordinator(ctx, key)
        if b is None:
            return _no_coordinator(ErrorCode.coordinator_not_available, "no live broker")
        return {"node_id": b.node_id, "host": b.host, "port": b.port,
                "error_code": ErrorCode.none, "error_message": None}
    return _no_coordinator(ErrorCode.invalid_request, "only group and transaction coordinators")


def _no_coordinator(code: ErrorCode, message: str) -> dict[str, object]:
    return {"node_id": -1, "host": "", "port": -1, "error_code": code, "error_message": message}


@api(DESCRIBE_GROUPS, 0, 5)
async def describe_groups(
    ctx: BrokerContext, head: RequestHead, req: DescribeGroupsRequest
) -> DescribeGroupsResponse:
    group_cls = nested(head, "DescribedGroup")
    member_cls = nested(head, "DescribedGroupMember")
    out = []
    tables: dict[str, tablegroups.TableGroup] | None = None  # read once, if asked about
    for gid in req.groups:
        local = await here(ctx, gid)
        g = ctx.groups.groups.get(gid) if local else None
        if g is None:
            state = "Empty" if local and ctx.offsets.of_group(gid) else "Dead"
            code, ptype = ErrorCode.none if local else ErrorCode.not_coordinator, ""
            if local and tablegroups.is_table_group(gid):  # a table's: Empty while it has one
                try:
                    tables = await tablegroups.read(ctx.table_work) if tables is None else tables
                    state = tablegroups.EMPTY if gid in tables else "Dead"
                    ptype = tablegroups.PROTOCOL_TYPE if gid in tables else ""
                except KafkaError as e:
                    code = e.code
            out.append(
                build(
                    group_cls,
                    error_code=code,
                    group_id=gid,
                    group_state=state,
                    protocol_type=ptype,
                    protocol_data="",
                    members=(),
                    authorized_operations=AUTHORIZED_OPS_OMITTED,
                )
            )
            continue
        stable = g.state == "Stable"
        members = tuple(
            build(
                member_cls,
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata_for(g.protocol_name)
                if stable and g.protocol_name
                else b"",
                member_assignment=m.assignment if stable else b"",
            )
            for m in g.members.values()
        )
        out.append(
            build(
                group_cls,
                error_code=ErrorCode.none,
                group_id=gid,
                group_state=g.state,
                protocol_type=g.protocol_type or "",
                protocol_data=(g.protocol_name or "") if stable else "",
                members=members,
                authorized_operations=AUTHORIZED_OPS_OMITTED,
            )
        )
    return build(resp(head, DESCRIBE_GROUPS), throttle_time=ZERO_MS, groups=tuple(out))


@api(LIST_GROUPS, 0, 4)
async def list_groups(
    ctx: BrokerContext, head: RequestHead, req: ListGroupsRequest
) -> ListGroupsResponse:
    listed = nested(head, "ListedGroup")
    old = ListGroupsV0 | ListGroupsV1 | ListGroupsV2 | ListGroupsV3  # no states_filter
    wanted = set() if isinstance(req, old) else {s.lower() for s in req.states_filter}
    states: dict[str, tuple[str, str]] = {
        gid: ("consumer", "Empty") for gid in ctx.offsets.offsets if ctx.offsets.of_group(gid)
    }
    for gid, g in ctx.groups.groups.items():
        if g.members or gid not in states:
            states[gid] = (g.protocol_type or "consumer", g.state)
    try:  # the tables' groups (floe-table.*), each listed by the broker coordinating it
        view = ctx.storage.cluster_view()
        tables = tablegroups.listed(await tablegroups.read(ctx.table_work))
        states = {g: s for g, s in states.items() if not tablegroups.is_table_group(g)}
        states.update((g, s) for g, s in tables.items() if is_local(g, view, ctx.node_id))
    except KafkaError as e:
        return build(resp(head, LIST_GROUPS), throttle_time=ZERO_MS, error_code=e.code,
                     groups=())
    groups = tuple(
        build(listed, group_id=gid, protocol_type=ptype, group_state=state)
        for gid, (ptype, state) in sorted(states.items())
        if not wanted or state.lower() in wanted
    )
    return build(
        resp(head, LIST_GROUPS), throttle_time=ZERO_MS, error_code=ErrorCode.none, groups=groups
    )


@api(DELETE_GROUPS, 0, 2)
async def delete_groups(
    ctx: BrokerContext, head: RequestHead, req: DeleteGroupsRequest
) -> DeleteGroupsResponse:
    result_cls = nested(head, "DeletableGroupResult")
    results = []
    for gid in req.groups_names:
        code = ErrorCode.none
        try:
            tablegroups.refuse(gid)  # floe-table.*: a table's read-only group
            await require_here(ctx, gid)
            if gid not in ctx.groups.groups and not ctx.offsets.of_group(gid):
                raise KafkaError(ErrorCode.group_id_not_found)
            ctx.groups.delete(gid)
            await ctx.offsets.delete(gid, None)
        except KafkaError as e:
            code = e.code
        results.append(build(result_cls, group_id=gid, error_code=code))
    return build(resp(head, DELETE_GROUPS), throttle_time=ZERO_MS, results=tuple(results))
