"""OffsetCommit (8), OffsetFetch (9), OffsetDelete (47)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from kio.schema.offset_commit.v2 import request as commit_v2
from kio.schema.offset_commit.v3 import request as commit_v3
from kio.schema.offset_commit.v4 import request as commit_v4
from kio.schema.offset_commit.v5 import request as commit_v5
from kio.schema.offset_commit.v6 import request as commit_v6
from kio.schema.offset_fetch.v7 import request as fetch_v7
from kio.schema.offset_fetch.v8 import request as fetch_v8

from broker.errors import ErrorCode, KafkaError
from broker.groups import tablegroups
from broker.groups.offsets import MAX_METADATA_BYTES
from broker.handlers.apitypes import (
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from broker.handlers.base import ZERO_MS, BrokerContext, Entity, api, build, nested, resp
from broker.handlers.coordination import here, require_here
from broker.metadata.model import OffsetRow
from broker.protocol.codec import RequestHead


@api(OFFSET_COMMIT, 2, 8)
async def offset_commit(
    ctx: BrokerContext, head: RequestHead, req: OffsetCommitRequest
) -> OffsetCommitResponse:
    old = (  # no group_instance_id before v7
        commit_v2.OffsetCommitRequest
        | commit_v3.OffsetCommitRequest
        | commit_v4.OffsetCommitRequest
        | commit_v5.OffsetCommitRequest
        | commit_v6.OffsetCommitRequest
    )
    no_epoch = (  # no committed_leader_epoch before v6
        commit_v2.OffsetCommitRequestPartition
        | commit_v3.OffsetCommitRequestPartition
        | commit_v4.OffsetCommitRequestPartition
        | commit_v5.OffsetCommitRequestPartition
    )
    part_cls = nested(head, "OffsetCommitResponsePartition")
    topic_cls = nested(head, "OffsetCommitResponseTopic")
    group_error = None
    try:
        tablegroups.refuse(req.group_id)  # floe-table.*: a table's read-only group
        await require_here(ctx, req.group_id)
        ctx.groups.check_commit(
            req.group_id,
            req.generation_id_or_member_epoch,
            req.member_id,
            None if isinstance(req, old) else req.group_instance_id,
        )
    except KafkaError as e:
        group_error = e.code
    codes: dict[tuple[str, int], ErrorCode] = {}
    entries: list[tuple[str, int, int, int, str | None]] = []
    for t in req.topics:
        for p in t.partitions:
            code = group_error or ErrorCode.none
            if code == ErrorCode.none:
                try:
                    ctx.storage.stream_id(t.name, p.partition_index)
                    if p.committed_metadata and len(p.committed_metadata.encode()) > (
                        MAX_METADATA_BYTES
                    ):
                        raise KafkaError(ErrorCode.offset_metadata_too_large)
                    entries.append(
                        (
                            t.name,
                            p.partition_index,
                            p.committed_offset,
                            -1 if isinstance(p, no_epoch) else p.committed_leader_epoch,
                            p.committed_metadata,
                        )
                    )
                except KafkaError as e:
                    code = e.code
            codes[(t.name, p.partition_index)] = code
    if entries:
        try:
            await ctx.offsets.commit(req.group_id, entries)
        except KafkaError as e:  # NOT_COORDINATOR: another broker took the group over
            for name, index, *_ in entries:
                codes[(name, index)] = e.code
        except Exception:
            for name, index, *_ in entries:
                codes[(name, index)] = ErrorCode.coordinator_not_available  # retriable
    topics = commit_errors(topic_cls, part_cls, req.topics, codes)
    return build(resp(head, OFFSET_COMMIT), throttle_time=ZERO_MS, topics=topics)


class _CommittedPartition(Protocol):
    @property
    def partition_index(self) -> int: ...


class _Committed(Protocol):
    """A topic of an OffsetCommit or TxnOffsetCommit request."""

    @property
    def name(self) -> str: ...

    @property
    def partitions(self) -> Sequence[_CommittedPartition]: ...


def commit_errors(
    topic_cls: type[Entity], part_cls: type[Entity], topics: Iterable[_Committed],
    codes: dict[tuple[str, int], ErrorCode],
) -> tuple[Entity, ...]:
    """The answer's topics of an offset commit: each requested partition with its code, in
    the request's order."""
    return tuple(
        build(
            topic_cls,
            name=t.name,
            partitions=tuple(
                build(
                    part_cls,
                    partition_index=p.partition_index,
                    error_code=codes[(t.name, p.partition_index)],
                )
                for p in t.partitions
            ),
        )
        for t in topics
    )


class _Wanted(Protocol):
    """A topic of an OffsetFetch request (its class differs by version)."""

    @property
    def name(self) -> str: ...

    @property
    def partition_indexes(self) -> tuple[int, ...]: ...


def _wanted(topics: Iterable[_Wanted] | None) -> dict[str, list[int]] | None:
    return None if topics is None else {t.name: list(t.partition_indexes) for t in topics}


class _Offsets(Protocol):
    """Where committed offsets are read: the OffsetStore, or a table's (tablegroups)."""

    def get(self, group_id: str, topic: str, partition: int) -> OffsetRow | None: ...

    def of_group(self, group_id: str) -> dict[tuple[str, int], OffsetRow]: ...


async def _sources(ctx: BrokerContext, group_ids: Iterable[str]) -> dict[str, _Offsets]:
    """The offsets each group is read from: a table group's are the table's, read from the
    metadata database once for the request."""
    ids = set(group_ids)
    if not any(tablegroups.is_table_group(g) for g in ids):
        return dict.fromkeys(ids, ctx.offsets)
    tables = await tablegroups.read(ctx.table_work)
    return {g: tables.get(g, tablegroups.NoOffsets()) if tablegroups.is_table_group(g)
            else ctx.offsets for g in ids}


def _fetch_group(
    ctx: BrokerContext,
    head: RequestHead,
    group_id: str,
    topics: dict[str, list[int]] | None,
    part_name: str,
    topic_name: str,
    require_stable: bool,
    offsets: _Offsets,
) -> tuple[Entity, ...]:
    """The group's committed offsets; with require_stable (read_committed consumers), a
    partition with a transactional offset still pending answers UNSTABLE_OFFSET_COMMIT (the
    client asks again once its transaction ended)."""
    part_cls = nested(head, part_name)
    topic_cls = nested(head, topic_name)
    if topics is None:  # all committed offsets of the group
        wanted: dict[str, list[int]] = {}
        for t, p in sorted(offsets.of_group(group_id)):
            wanted.setdefault(t, []).append(p)
    else:
        wanted = topics
    out = []
    for name, partitions in wanted.items():
        parts = []
        for p in partitions:
            row = offsets.get(group_id, name, p)
            code = ErrorCode.none
            if require_stable and ctx.txn and ctx.txn.has_pending_offset(group_id, name, p):
                row, code = None, ErrorCode.unstable_offset_commit
            parts.append(
                build(
                    part_cls,
                    partition_index=p,
                    committed_offset=row.committed_offset if row else -1,
                    committed_leader_epoch=row.leader_epoch if row else -1,
                    metadata=(row.metadata or "") if row else "",
                    error_code=code,
                )
            )
        out.append(build(topic_cls, name=name, partitions=tuple(parts)))
    return tuple(out)


async def _serves(ctx: BrokerContext, group_id: str) -> bool:
    """OffsetFetch's coordinator check: this broker's view places the group here and the
    database still names this broker as the coordinator that took it (on a cluster a broker
    that has not yet seen a take-over must not answer from its older offsets). Table groups'
    offsets are read from their table's progress, whoever answers."""
    if not await here(ctx, group_id):
        return False
    return tablegroups.is_table_group(group_id) or await ctx.offsets.still_held(group_id)


@api(OFFSET_FETCH, 1, 8)
async def offset_fetch(
    ctx: BrokerContext, head: RequestHead, req: OffsetFetchRequest
) -> OffsetFetchResponse:
    if isinstance(req, fetch_v8.OffsetFetchRequest):
        group_cls = nested(head, "OffsetFetchResponseGroup")
        codes = {g.group_id: ErrorCode.none if await _serves(ctx, g.group_id)
                 else ErrorCode.not_coordinator for g in req.groups}
        try:
            sources = await _sources(ctx, (g for g, c in codes.items() if c == ErrorCode.none))
        except KafkaError as e:  # the table groups' rows unreadable now: they alone fail
            codes.update({g: e.code for g, c in codes.items()
                          if c == ErrorCode.none and tablegroups.is_table_group(g)})
            sources = await _sources(ctx, (g for g, c in codes.items() if c == ErrorCode.none))
        groups = tuple(
            build(
                group_cls,
                group_id=g.group_id,
                error_code=codes[g.group_id],
                topics=() if codes[g.group_id] != ErrorCode.none else _fetch_group(
                    ctx,
                    head,
                    g.group_id,
                    _wanted(g.topics),
                    "OffsetFetchResponsePartitions",
                    "OffsetFetchResponseTopics",
                    req.require_stable,
                    sources[g.group_id],
                ),
            )
            for g in req.groups
        )
        return build(resp(head, OFFSET_FETCH), throttle_time=ZERO_MS, groups=groups)
    if not await _serves(ctx, req.group_id):
        return build(resp(head, OFFSET_FETCH), throttle_time=ZERO_MS, topics=(),
                     error_code=ErrorCode.not_coordinator)
    try:
        source = (await _sources(ctx, [req.group_id]))[req.group_id]
    except KafkaError as e:
        return build(resp(head, OFFSET_FETCH), throttle_time=ZERO_MS, topics=(),
                     error_code=e.code)
    topics = _fetch_group(
        ctx,
        head,
        req.group_id,
        _wanted(req.topics),
        "OffsetFetchResponsePartition",
        "OffsetFetchResponseTopic",
        isinstance(req, fetch_v7.OffsetFetchRequest) and req.require_stable,
        source,
    )
    return build(
        resp(head, OFFSET_FETCH), throttle_time=ZERO_MS, topics=topics, error_code=ErrorCode.none
    )


@api(OFFSET_DELETE, 0, 0)
async def offset_delete(
    ctx: BrokerContext, head: RequestHead, req: OffsetDeleteRequest
) -> OffsetDeleteResponse:
    part_cls = nested(head, "OffsetDeleteResponsePartition")
    topic_cls = nested(head, "OffsetDeleteResponseTopic")
    table_group = tablegroups.is_table_group(req.group_id)  # read-only (tablegroups.REFUSAL)
    refusal = tablegroups.REFUSAL if table_group else None
    if refusal is None and not await here(ctx, req.group_id):
        refusal = ErrorCode.not_coordinator
    if refusal is None and (
        req.group_id not in ctx.groups.groups and not ctx.offsets.of_group(req.group_id)
    ):
        refusal = ErrorCode.group_id_not_found
    if refusal is not None:
        return build(resp(head, OFFSET_DELETE), error_code=refusal, throttle_time=ZERO_MS,
                     topics=())
    subscribed = ctx.groups.subscribed_topics(req.group_id)
    keys: list[tuple[str, int]] = []
    topics = []
    for t in req.topics:
        code = ErrorCode.group_subscribed_to_topic if t.name in subscribed else ErrorCode.none
        if code == ErrorCode.none:
            keys += [(t.name, p.partition_index) for p in t.partitions]
        topics.append(
            build(
                topic_cls,
                name=t.name,
                partitions=tuple(
                    build(part_cls, partition_index=p.partition_index, error_code=code)
                    for p in t.partitions
                ),
            )
        )
    if keys:
        try:
            await ctx.offsets.delete(req.group_id, keys)
        except KafkaError as e:  # NOT_COORDINATOR: another broker took the group over
            return build(resp(head, OFFSET_DELETE), error_code=e.code, throttle_time=ZERO_MS,
                         topics=())
    return build(
        resp(head, OFFSET_DELETE),
        error_code=ErrorCode.none,
        throttle_time=ZERO_MS,
        topics=tuple(topics),
    )
