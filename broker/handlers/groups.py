"""FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13), SyncGroup (14),
DescribeGroups (15), ListGroups (16), DeleteGroups (42)."""

from __future__ import annotations

from kio.schema.find_coordinator.v0.request import FindCoordinatorRequest as FindCoordinatorV0
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest as FindCoordinatorV4
from kio.schema.heartbeat.v0.request import HeartbeatRequest as HeartbeatV0
from kio.schema.heartbeat.v1.request import HeartbeatRequest as HeartbeatV1
from kio.schema.heartbeat.v2.request import HeartbeatRequest as HeartbeatV2
from kio.schema.join_group.v0.request import JoinGroupRequest as JoinGroupV0
from kio.schema.join_group.v1.request import JoinGroupRequest as JoinGroupV1
from kio.schema.join_group.v2.request import JoinGroupRequest as JoinGroupV2
from kio.schema.join_group.v3.request import JoinGroupRequest as JoinGroupV3
from kio.schema.join_group.v4.request import JoinGroupRequest as JoinGroupV4
from kio.schema.leave_group.v0.request import LeaveGroupRequest as LeaveGroupV0
from kio.schema.leave_group.v1.request import LeaveGroupRequest as LeaveGroupV1
from kio.schema.leave_group.v2.request import LeaveGroupRequest as LeaveGroupV2
from kio.schema.list_groups.v0.request import ListGroupsRequest as ListGroupsV0
from kio.schema.list_groups.v1.request import ListGroupsRequest as ListGroupsV1
from kio.schema.list_groups.v2.request import ListGroupsRequest as ListGroupsV2
from kio.schema.list_groups.v3.request import ListGroupsRequest as ListGroupsV3
from kio.schema.sync_group.v0.request import SyncGroupRequest as SyncGroupV0
from kio.schema.sync_group.v1.request import SyncGroupRequest as SyncGroupV1
from kio.schema.sync_group.v2.request import SyncGroupRequest as SyncGroupV2

from broker.errors import ErrorCode, KafkaError
from broker.groups.coordinator import MemberIdRequired
from broker.handlers.apitypes import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    SYNC_GROUP,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.protocol.codec import RequestHead

AUTHORIZED_OPS_OMITTED = -(2**31)


@api(FIND_COORDINATOR, 0, 4)
async def find_coordinator(
    ctx: BrokerContext, head: RequestHead, req: FindCoordinatorRequest
) -> FindCoordinatorResponse:
    key_type = 0 if isinstance(req, FindCoordinatorV0) else req.key_type
    code, message = ErrorCode.none, None
    if key_type != 0:
        code, message = ErrorCode.invalid_request, "only group coordinators (key type 0) exist"
    node, host, port = (ctx.node_id, ctx.host, ctx.port) if code == 0 else (-1, "", -1)
    if isinstance(req, FindCoordinatorV4):
        coord = nested(head, "Coordinator")
        return build(
            resp(head, FIND_COORDINATOR),
            throttle_time=ZERO_MS,
            coordinators=tuple(
                build(
                    coord,
                    key=k,
                    node_id=node,
                    host=host,
                    port=port,
                    error_code=code,
                    error_message=message,
                )
                for k in req.coordinator_keys
            ),
        )
    return build(
        resp(head, FIND_COORDINATOR),
        throttle_time=ZERO_MS,
        error_code=code,
        error_message=message,
        node_id=node,
        host=host,
        port=port,
    )


@api(JOIN_GROUP, 0, 9)
async def join_group(
    ctx: BrokerContext, head: RequestHead, req: JoinGroupRequest
) -> JoinGroupResponse:
    session_s = req.session_timeout.total_seconds()
    rebalance_s = (
        session_s if isinstance(req, JoinGroupV0) else req.rebalance_timeout.total_seconds()
    )
    old = JoinGroupV0 | JoinGroupV1 | JoinGroupV2 | JoinGroupV3 | JoinGroupV4
    instance_id = None if isinstance(req, old) else req.group_instance_id
    try:
        r = await ctx.groups.join(
            req.group_id,
            req.member_id,
            instance_id,
            head.client_id or "",
            head.client_host,
            session_s,
            rebalance_s,
            req.protocol_type,
            [(p.name, p.metadata) for p in req.protocols],
            require_known_member_id=head.api_version >= 4,
        )
    except MemberIdRequired as e:
        return _join_error(head, ErrorCode.member_id_required, e.member_id)
    except KafkaError as e:
        return _join_error(head, e.code, req.member_id)
    member = nested(head, "JoinGroupResponseMember")
    return build(
        resp(head, JOIN_GROUP),
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        generation_id=r.generation,
        protocol_type=r.protocol_type,
        protocol_name=r.protocol_name,
        leader=r.leader,
        skip_assignment=False,
        member_id=r.member_id,
        members=tuple(
            build(member, member_id=mid, group_instance_id=iid, metadata=md)
            for mid, iid, md in r.members
        ),
    )


def _join_error(head: RequestHead, code: ErrorCode, member_id: str) -> JoinGroupResponse:
    return build(
        resp(head, JOIN_GROUP),
        throttle_time=ZERO_MS,
        error_code=code,
        generation_id=-1,
        protocol_type=None,
        protocol_name="" if head.api_version < 7 else None,
        leader="",
        skip_assignment=False,
        member_id=member_id,
        members=(),
    )


@api(SYNC_GROUP, 0, 5)
async def sync_group(
    ctx: BrokerContext, head: RequestHead, req: SyncGroupRequest
) -> SyncGroupResponse:
    old = SyncGroupV0 | SyncGroupV1 | SyncGroupV2
    try:
        assignment, ptype, pname = await ctx.groups.sync(
            req.group_id,
            req.generation_id,
            req.member_id,
            None if isinstance(req, old) else req.group_instance_id,
            {a.member_id: a.assignment for a in req.assignments},
        )
        code = ErrorCode.none
    except KafkaError as e:
        assignment, ptype, pname, code = b"", None, None, e.code
    return build(
        resp(head, SYNC_GROUP),
        throttle_time=ZERO_MS,
        error_code=code,
        protocol_type=ptype,
        protocol_name=pname,
        assignment=assignment,
    )


@api(HEARTBEAT, 0, 4)
async def heartbeat(
    ctx: BrokerContext, head: RequestHead, req: HeartbeatRequest
) -> HeartbeatResponse:
    code = ErrorCode.none
    old = HeartbeatV0 | HeartbeatV1 | HeartbeatV2
    try:
        ctx.groups.heartbeat(
            req.group_id,
            req.generation_id,
            req.member_id,
            None if isinstance(req, old) else req.group_instance_id,
        )
    except KafkaError as e:
        code = e.code
    return build(resp(head, HEARTBEAT), throttle_time=ZERO_MS, error_code=code)


@api(LEAVE_GROUP, 0, 5)
async def leave_group(
    ctx: BrokerContext, head: RequestHead, req: LeaveGroupRequest
) -> LeaveGroupResponse:
    if isinstance(req, LeaveGroupV0 | LeaveGroupV1 | LeaveGroupV2):
        code = ErrorCode.none
        try:
            ctx.groups.leave(req.group_id, req.member_id, None)
        except KafkaError as e:
            code = e.code
        return build(resp(head, LEAVE_GROUP), throttle_time=ZERO_MS, error_code=code)
    results = []
    member_cls = nested(head, "MemberResponse")
    for m in req.members:
        code = ErrorCode.none
        try:
            ctx.groups.leave(req.group_id, m.member_id, m.group_instance_id)
        except KafkaError as e:
            code = e.code
        results.append(
            build(
                member_cls,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                error_code=code,
            )
        )
    return build(
        resp(head, LEAVE_GROUP),
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        members=tuple(results),
    )


@api(DESCRIBE_GROUPS, 0, 5)
async def describe_groups(
    ctx: BrokerContext, head: RequestHead, req: DescribeGroupsRequest
) -> DescribeGroupsResponse:
    group_cls = nested(head, "DescribedGroup")
    member_cls = nested(head, "DescribedGroupMember")
    out = []
    for gid in req.groups:
        g = ctx.groups.groups.get(gid)
        if g is None:
            state = "Empty" if ctx.offsets.of_group(gid) else "Dead"
            out.append(
                build(
                    group_cls,
                    error_code=ErrorCode.none,
                    group_id=gid,
                    group_state=state,
                    protocol_type="",
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
            if gid not in ctx.groups.groups and not ctx.offsets.of_group(gid):
                raise KafkaError(ErrorCode.group_id_not_found)
            ctx.groups.delete(gid)
            await ctx.offsets.delete(gid, None)
        except KafkaError as e:
            code = e.code
        results.append(build(result_cls, group_id=gid, error_code=code))
    return build(resp(head, DELETE_GROUPS), throttle_time=ZERO_MS, results=tuple(results))
