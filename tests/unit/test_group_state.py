"""The classic group protocol's state transitions (broker/groups/state.py) under a fake clock:
rebalances, session and rebalance timeouts, late joiners, LeaveGroup, and the error codes
Kafka's GroupCoordinator answers with. No event loop, no sleeping: time moves when a test
says so."""

from __future__ import annotations

import pytest

from broker.errors import ErrorCode, KafkaError
from broker.groups import queries
from broker.groups.model import (
    COMPLETING,
    EMPTY,
    PREPARING,
    STABLE,
    Effect,
    Failed,
    JoinDone,
    JoinResult,
    JoinTimer,
    MemberIdRequired,
    SyncDone,
)
from broker.groups.state import GroupTable, Wait

PROTOCOLS = [("range", b"range-meta"), ("roundrobin", b"rr-meta")]
SESSION_S, REBALANCE_S, INITIAL_DELAY_S = 10.0, 30.0, 3.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def table(clock: FakeClock) -> GroupTable:
    return GroupTable(clock, initial_delay_s=INITIAL_DELAY_S, min_session_s=1.0)


def join(t: GroupTable, member_id: str = "", instance_id: str | None = None) -> Wait:
    return t.join(
        "g", member_id, instance_id, "client", "/127.0.0.1", SESSION_S, REBALANCE_S,
        "consumer", PROTOCOLS, require_known_member_id=False,
    )  # fmt: skip


def joined(effects: list[Effect]) -> dict[int, JoinResult]:
    return {e.ticket: e.result for e in effects if isinstance(e, JoinDone)}


def failed(effects: list[Effect]) -> dict[int, ErrorCode]:
    return {e.ticket: e.code for e in effects if isinstance(e, Failed)}


def synced(effects: list[Effect]) -> dict[int, bytes]:
    return {e.ticket: e.assignment for e in effects if isinstance(e, SyncDone)}


def code(call: object, *args: object) -> ErrorCode:
    assert callable(call)
    with pytest.raises(KafkaError) as e:
        call(*args)
    return e.value.code


def stable_pair(t: GroupTable, clock: FakeClock) -> tuple[str, str]:
    """Two members in a Stable generation 1: (leader, follower)."""
    a, b = join(t), join(t)
    clock.now += INITIAL_DELAY_S
    results = joined(t.advance())
    leader = results[a.ticket].leader
    follower = b.member_id if leader == a.member_id else a.member_id
    t.sync("g", 1, leader, None, {leader: b"L", follower: b"F"})
    assert t.groups["g"].state == STABLE
    return leader, follower


def test_two_joins_make_one_generation_and_the_leader_gets_every_member(
    table: GroupTable, clock: FakeClock
) -> None:
    a = join(table)
    assert JoinTimer("g", clock.now + INITIAL_DELAY_S) in a.effects
    clock.now += 1.0
    b = join(table)
    assert not joined(a.effects + b.effects)  # the initial delay holds the join phase open
    clock.now += 1.9
    assert not joined(table.advance())
    clock.now += 0.1
    out = table.advance()
    results = joined(out)
    assert set(results) == {a.ticket, b.ticket}
    ra, rb = results[a.ticket], results[b.ticket]
    assert ra.generation == rb.generation == 1
    assert ra.leader == rb.leader == a.member_id
    assert ra.protocol_name == rb.protocol_name == "range"
    assert sorted(ra.members) == sorted(
        [(a.member_id, None, b"range-meta"), (b.member_id, None, b"range-meta")]
    )
    assert rb.members == []
    assert JoinTimer("g", None) in out
    assert table.groups["g"].state == COMPLETING
    # the follower's SyncGroup waits for the leader's, which answers both
    fs = table.sync("g", 1, b.member_id, None, {})
    assert not synced(fs.effects)
    ls = table.sync("g", 1, a.member_id, None, {a.member_id: b"A", b.member_id: b"B"})
    assert synced(ls.effects) == {fs.ticket: b"B", ls.ticket: b"A"}
    assert table.groups["g"].state == STABLE
    # a SyncGroup once stable gets the member's assignment at once
    again = table.sync("g", 1, b.member_id, None, {})
    assert synced(again.effects) == {again.ticket: b"B"}


def test_a_missed_session_timeout_removes_the_member_and_starts_a_rebalance(
    table: GroupTable, clock: FakeClock
) -> None:
    leader, follower = stable_pair(table, clock)
    for _ in range(2):  # only the follower heartbeats
        clock.now += SESSION_S / 2
        table.heartbeat("g", 1, follower, None)
        assert table.advance() == []
    clock.now += 0.01
    out = table.advance()
    assert leader not in table.groups["g"].members
    assert table.groups["g"].state == PREPARING
    assert JoinTimer("g", clock.now + REBALANCE_S) in out
    assert code(table.heartbeat, "g", 1, follower, None) == ErrorCode.rebalance_in_progress
    assert code(table.heartbeat, "g", 1, leader, None) == ErrorCode.unknown_member_id
    rejoin = join(table, follower)  # the last member rejoining ends the join phase at once
    result = joined(rejoin.effects)[rejoin.ticket]
    assert (result.generation, result.leader) == (2, follower)
    assert result.members == [(follower, None, b"range-meta")]


def test_a_late_joiner_during_completing_rebalance_starts_a_new_rebalance(
    table: GroupTable, clock: FakeClock
) -> None:
    a, b = join(table), join(table)
    clock.now += INITIAL_DELAY_S
    table.advance()
    assert table.groups["g"].state == COMPLETING
    waiting = table.sync("g", 1, b.member_id, None, {})
    c = join(table)
    assert failed(c.effects) == {waiting.ticket: ErrorCode.rebalance_in_progress}
    assert table.groups["g"].state == PREPARING
    assert code(table.sync, "g", 1, a.member_id, None, {}) == ErrorCode.rebalance_in_progress
    ra = join(table, a.member_id)
    assert not joined(ra.effects)  # b has not rejoined yet
    rb = join(table, b.member_id)
    results = joined(rb.effects)
    assert set(results) == {ra.ticket, rb.ticket, c.ticket}
    assert {r.generation for r in results.values()} == {2}
    assert len(results[ra.ticket].members) == 3  # a stays leader


def test_the_rebalance_timeout_drops_members_that_did_not_rejoin(
    table: GroupTable, clock: FakeClock
) -> None:
    leader, follower = stable_pair(table, clock)
    rejoin = join(table, leader)  # e.g. its subscription changed
    assert JoinTimer("g", clock.now + REBALANCE_S) in rejoin.effects
    for _ in range(5):  # the follower stays alive but never rejoins
        clock.now += REBALANCE_S / 6
        assert code(table.heartbeat, "g", 1, follower, None) == ErrorCode.rebalance_in_progress
        assert table.advance() == []
    clock.now += REBALANCE_S / 6
    out = table.advance()
    result = joined(out)[rejoin.ticket]
    assert (result.generation, result.members) == (2, [(leader, None, b"range-meta")])
    assert list(table.groups["g"].members) == [leader]
    assert code(table.heartbeat, "g", 2, follower, None) == ErrorCode.unknown_member_id


def test_leave_group(table: GroupTable, clock: FakeClock) -> None:
    leader, follower = stable_pair(table, clock)
    assert table.leave("g", follower, None) == [JoinTimer("g", clock.now + REBALANCE_S)]
    assert table.groups["g"].state == PREPARING
    assert code(table.heartbeat, "g", 1, leader, None) == ErrorCode.rebalance_in_progress
    rejoin = join(table, leader)
    assert joined(rejoin.effects)[rejoin.ticket].generation == 2
    assert code(table.leave, "g", follower, None) == ErrorCode.unknown_member_id
    table.leave("g", leader, None)
    g = table.groups["g"]
    assert (g.state, g.generation, g.leader, g.members) == (EMPTY, 3, None, {})


def test_a_leave_ends_a_join_phase_the_others_already_rejoined(
    table: GroupTable, clock: FakeClock
) -> None:
    leader, follower = stable_pair(table, clock)
    rejoin = join(table, leader)
    out = table.leave("g", follower, None)
    assert joined(out)[rejoin.ticket].generation == 2


def test_stale_generation_unknown_member_and_rebalance_in_progress(
    table: GroupTable, clock: FakeClock
) -> None:
    leader, follower = stable_pair(table, clock)
    assert code(table.heartbeat, "g", 0, follower, None) == ErrorCode.illegal_generation
    assert code(table.sync, "g", 2, follower, None, {}) == ErrorCode.illegal_generation
    assert code(queries.check_commit, table.groups, "g", 0, follower, None) == (
        ErrorCode.illegal_generation
    )
    assert code(table.heartbeat, "g", 1, "nobody", None) == ErrorCode.unknown_member_id
    assert code(table.sync, "nogroup", 1, follower, None, {}) == ErrorCode.unknown_member_id
    assert code(join, table, "nobody") == ErrorCode.unknown_member_id
    join(table, leader)  # PreparingRebalance
    assert code(table.sync, "g", 1, follower, None, {}) == ErrorCode.rebalance_in_progress
    assert code(table.heartbeat, "g", 1, follower, None) == ErrorCode.rebalance_in_progress


def test_offset_commits_follow_kafka_rules(table: GroupTable, clock: FakeClock) -> None:
    a, b = join(table), join(table)
    clock.now += INITIAL_DELAY_S
    table.advance()
    commit = queries.check_commit
    # CompletingRebalance: the assignment is not handed out yet
    assert code(commit, table.groups, "g", 1, a.member_id, None) == (
        ErrorCode.rebalance_in_progress
    )
    table.heartbeat("g", 1, b.member_id, None)  # heartbeats are fine meanwhile
    table.sync("g", 1, a.member_id, None, {})
    commit(table.groups, "g", 1, a.member_id, None)
    # a commit outside group management needs a group with no member
    assert code(commit, table.groups, "g", -1, "", None) == ErrorCode.unknown_member_id
    commit(table.groups, "other", -1, "", None)
    join(table, a.member_id)  # PreparingRebalance: commits of the current generation pass
    assert table.groups["g"].state == PREPARING
    commit(table.groups, "g", 1, a.member_id, None)


def test_member_id_required_then_rejoin_with_it(table: GroupTable) -> None:
    def join_v4(member_id: str) -> Wait:
        return table.join(
            "g", member_id, None, "client", "h", SESSION_S, REBALANCE_S, "consumer",
            PROTOCOLS, require_known_member_id=True,
        )  # fmt: skip

    with pytest.raises(MemberIdRequired) as e:
        join_v4("")
    assert table.groups["g"].members == {}
    assert code(join_v4, "made-up") == ErrorCode.unknown_member_id
    w = join_v4(e.value.member_id)
    assert w.member_id == e.value.member_id
    assert list(table.groups["g"].members) == [w.member_id]
    assert e.value.member_id not in table.groups["g"].pending_ids


def test_a_member_id_handed_out_is_forgotten_after_a_session_timeout(
    table: GroupTable, clock: FakeClock
) -> None:
    def join_v4(member_id: str) -> Wait:
        return table.join(
            "g", member_id, None, "client", "h", SESSION_S, REBALANCE_S, "consumer",
            PROTOCOLS, require_known_member_id=True,
        )  # fmt: skip

    with pytest.raises(MemberIdRequired) as e:
        join_v4("")
    clock.now += SESSION_S
    table.advance()
    assert e.value.member_id in table.groups["g"].pending_ids
    clock.now += 0.01
    table.advance()
    assert code(join_v4, e.value.member_id) == ErrorCode.unknown_member_id
    with pytest.raises(MemberIdRequired) as e:
        join_v4("")
    assert table.leave("g", e.value.member_id, None) == []  # a pending member may leave
    assert code(join_v4, e.value.member_id) == ErrorCode.unknown_member_id


def test_a_static_member_rejoining_fences_its_old_incarnation(
    table: GroupTable, clock: FakeClock
) -> None:
    old = join(table, instance_id="i1")
    new = join(table, instance_id="i1")
    assert new.member_id != old.member_id
    assert failed(new.effects) == {old.ticket: ErrorCode.fenced_instance_id}
    assert list(table.groups["g"].members) == [new.member_id]
    clock.now += INITIAL_DELAY_S
    assert joined(table.advance())[new.ticket].members == [(new.member_id, "i1", b"range-meta")]
    assert code(table.heartbeat, "g", 1, old.member_id, "i1") == ErrorCode.fenced_instance_id
    assert code(join, table, old.member_id, "i1") == ErrorCode.fenced_instance_id
    table.heartbeat("g", 1, new.member_id, "i1")
    assert table.leave("g", "", "i1") == []  # the last member: Empty, no join phase
    assert table.groups["g"].static == {}


def test_a_repeated_join_answers_the_first_with_rebalance_in_progress(table: GroupTable) -> None:
    first = join(table)
    second = join(table, first.member_id)
    assert failed(second.effects) == {first.ticket: ErrorCode.rebalance_in_progress}
    assert table.groups["g"].members[first.member_id].join_ticket == second.ticket


def test_an_abandoned_join_does_not_count_as_rejoined(table: GroupTable, clock: FakeClock) -> None:
    leader, follower = stable_pair(table, clock)
    first = join(table, leader)  # a rebalance, waiting for the follower
    table.abandon("g", first.ticket)  # the leader's connection closed
    follower_rejoin = join(table, follower)
    assert not joined(follower_rejoin.effects)  # the leader has not rejoined now
    again = join(table, leader)
    assert set(joined(again.effects)) == {again.ticket, follower_rejoin.ticket}


def test_a_repeated_join_with_unchanged_metadata_gets_the_current_generation(
    table: GroupTable, clock: FakeClock
) -> None:
    a, b = join(table), join(table)
    clock.now += INITIAL_DELAY_S
    first = joined(table.advance())
    waiting = table.sync("g", 1, b.member_id, None, {})
    # CompletingRebalance: the leader or a follower asking again (its answer lost, say)
    for w in (a, b):
        again = join(table, w.member_id)
        assert joined(again.effects) == {again.ticket: first[w.ticket]}
    assert table.groups["g"].state == COMPLETING  # no new rebalance; b's SyncGroup still waits
    ls = table.sync("g", 1, a.member_id, None, {a.member_id: b"A", b.member_id: b"B"})
    assert synced(ls.effects) == {waiting.ticket: b"B", ls.ticket: b"A"}
    # Stable: a follower asking again gets generation 1 (no member list), then its assignment
    again = join(table, b.member_id)
    assert joined(again.effects) == {again.ticket: first[b.ticket]}
    assert table.groups["g"].state == STABLE
    # changed metadata does start a rebalance, as does the leader's JoinGroup
    changed = table.join(
        "g", b.member_id, None, "client", "h", SESSION_S, REBALANCE_S, "consumer",
        [("range", b"other-topics")], False,
    )  # fmt: skip
    assert not joined(changed.effects)
    assert table.groups["g"].state == PREPARING


def test_requests_the_group_cannot_take(table: GroupTable) -> None:
    def join_with(session_s: float, ptype: str, protocols: list[tuple[str, bytes]]) -> Wait:
        return table.join("g", "", None, "c", "h", session_s, 5.0, ptype, protocols, False)

    assert code(join_with, 0.5, "consumer", PROTOCOLS) == ErrorCode.invalid_session_timeout
    assert code(join_with, SESSION_S, "consumer", []) == ErrorCode.inconsistent_group_protocol
    join_with(SESSION_S, "consumer", PROTOCOLS)
    assert code(join_with, SESSION_S, "connect", PROTOCOLS) == (
        ErrorCode.inconsistent_group_protocol
    )
    assert code(join_with, SESSION_S, "consumer", [("sticky", b"")]) == (
        ErrorCode.inconsistent_group_protocol
    )
    assert code(queries.delete, table.groups, "g") == ErrorCode.non_empty_group


def test_members_that_waited_out_a_long_join_phase_are_not_expired_on_its_end(
    table: GroupTable, clock: FakeClock
) -> None:
    leader, follower = stable_pair(table, clock)
    join(table, leader)  # waits while the follower takes two session timeouts to rejoin
    for _ in range(4):
        clock.now += SESSION_S / 2
        assert code(table.heartbeat, "g", 1, follower, None) == ErrorCode.rebalance_in_progress
    rejoin = join(table, follower)
    assert len(joined(rejoin.effects)) == 2
    clock.now += 0.5
    assert table.advance() == []
    assert set(table.groups["g"].members) == {leader, follower}
