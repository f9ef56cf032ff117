"""JoinGroup (11), Heartbeat (12), LeaveGroup (13), SyncGroup (14): a member's part in its
group (FindCoordinator, DescribeGroups, ListGroups and DeleteGroups are in group_admin.py)."""

from __future__ import annotations

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
from kio.schema.sync_group.v0.request import SyncGroupRequest as SyncGroupV0
from kio.schema.sync_group.v1.request import SyncGroupRequest as SyncGroupV1
from kio.schema.sync_group.v2.request import SyncGroupRequest as SyncGroupV2

from broker.errors import ErrorCode, KafkaError
from broker.groups.coordinator import MemberIdRequired
from broker.groups.tablegroups import REFUSAL, is_table_group, refuse
from broker.handlers.apitypes import (
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    SYNC_GROUP,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.handlers.coordination import here, require_here
from broker.protocol.codec import RequestHead


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
        refuse(req.group_id)  # floe-table.*: a table's read-only group (tablegroups.REFUSAL)
        await require_here(ctx, req.group_id)
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
        refuse(req.group_id)
        await require_here(ctx, req.group_id)
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
        refuse(req.group_id)
        await require_here(ctx, req.group_id)
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
            refuse(req.group_id)
            await require_here(ctx, req.group_id)
            ctx.groups.leave(req.group_id, req.member_id, None)
        except KafkaError as e:
            code = e.code
        return build(resp(head, LEAVE_GROUP), throttle_time=ZERO_MS, error_code=code)
    if is_table_group(req.group_id) or not await here(ctx, req.group_id):
        code = REFUSAL if is_table_group(req.group_id) else ErrorCode.not_coordinator
        return build(resp(head, LEAVE_GROUP), throttle_time=ZERO_MS, error_code=code, members=())
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
