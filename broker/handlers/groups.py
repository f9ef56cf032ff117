"""FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13), SyncGroup (14),
DescribeGroups (15), ListGroups (16), DeleteGroups (42)."""

from __future__ import annotations

from typing import Any

from broker.errors import ErrorCode, KafkaError
from broker.groups.coordinator import MemberIdRequired
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, nested, resp
from broker.protocol.codec import RequestHead

AUTHORIZED_OPS_OMITTED = -(2**31)


@api(10, 0, 4)
async def find_coordinator(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    key_type = getattr(req, "key_type", 0)
    code, message = ErrorCode.none, None
    if key_type != 0:
        code, message = ErrorCode.invalid_request, "only group coordinators (key type 0) exist"
    node, host, port = (ctx.node_id, ctx.host, ctx.port) if code == 0 else (-1, "", -1)
    if hasattr(req, "coordinator_keys"):
        coord = nested(head, "Coordinator")
        return build(
            resp(head),
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
        resp(head),
        throttle_time=ZERO_MS,
        error_code=code,
        error_message=message,
        node_id=node,
        host=host,
        port=port,
    )


@api(11, 0, 9)
async def join_group(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    session_s = req.session_timeout.total_seconds()
    rebalance = getattr(req, "rebalance_timeout", None)
    try:
        r = await ctx.groups.join(
            req.group_id,
            req.member_id,
            getattr(req, "group_instance_id", None),
            head.client_id or "",
            head.client_host,
            session_s,
            rebalance.total_seconds() if rebalance is not None else session_s,
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
        resp(head),
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


def _join_error(head: RequestHead, code: ErrorCode, member_id: str) -> Any:
    return build(
        resp(head),
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


@api(14, 0, 5)
async def sync_group(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    try:
        assignment, ptype, pname = await ctx.groups.sync(
            req.group_id,
            req.generation_id,
            req.member_id,
            getattr(req, "group_instance_id", None),
            {a.member_id: a.assignment for a in req.assignments},
        )
        code = ErrorCode.none
    except KafkaError as e:
        assignment, ptype, pname, code = b"", None, None, e.code
    return build(
        resp(head),
        throttle_time=ZERO_MS,
        error_code=code,
        protocol_type=ptype,
        protocol_name=pname,
        assignment=assignment,
    )


@api(12, 0, 4)
async def heartbeat(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    code = ErrorCode.none
    try:
        ctx.groups.heartbeat(
            req.group_id, req.generation_id, req.member_id, getattr(req, "group_instance_id", None)
        )
    except KafkaError as e:
        code = e.code
    return build(resp(head), throttle_time=ZERO_MS, error_code=code)


@api(13, 0, 5)
async def leave_group(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    if not hasattr(req, "members"):
        code = ErrorCode.none
        try:
            ctx.groups.leave(req.group_id, req.member_id, None)
        except KafkaError as e:
            code = e.code
        return build(resp(head), throttle_time=ZERO_MS, error_code=code)
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
        resp(head), throttle_time=ZERO_MS, error_code=ErrorCode.none, members=tuple(results)
    )


@api(15, 0, 5)
async def describe_groups(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
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
    return build(resp(head), throttle_time=ZERO_MS, groups=tuple(out))


@api(16, 0, 4)
async def list_groups(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    listed = nested(head, "ListedGroup")
    wanted = {s.lower() for s in getattr(req, "states_filter", ())}
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
    return build(resp(head), throttle_time=ZERO_MS, error_code=ErrorCode.none, groups=groups)


@api(42, 0, 2)
async def delete_groups(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
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
    return build(resp(head), throttle_time=ZERO_MS, results=tuple(results))
