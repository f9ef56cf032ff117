"""The pure statistics of benchmarks.tablefreshness_cluster: which snapshot made a record
visible, freshness percentiles, recovery after a kill."""

from __future__ import annotations

import pytest

from benchmarks.icebergreader import Seen, parse_offsets, visibility
from benchmarks.tablefreshness_cluster import (
    gaps,
    leader_moves,
    recovery,
    regressions,
    row_mismatches,
    summarize,
    timeline,
)


def seen(at: float, offsets: dict[int, int]) -> Seen:
    return Seen(at, int(at * 10), at - 0.1, offsets, sum(offsets.values()))


def test_a_record_is_visible_in_the_first_snapshot_past_its_offset() -> None:
    acks = {0: [(0, 1.0), (1, 1.2), (2, 1.4)], 1: [(0, 1.1)]}
    snaps = [seen(2.0, {0: 1}), seen(3.0, {0: 2, 1: 1}), seen(4.0, {0: 2, 1: 1})]
    by = {(r.partition, r.offset): r for r in visibility(acks, snaps)}
    assert by[0, 0].visible_at == 2.0
    assert by[0, 1].visible_at == 3.0
    assert by[0, 1].committed_at == pytest.approx(2.9)
    assert by[0, 2].visible_at is None and by[0, 2].freshness is None
    assert by[1, 0].freshness == pytest.approx(1.9)


def test_summary_counts_what_never_became_visible() -> None:
    acks = {0: [(0, 1.0), (1, 1.5), (2, 9.0)]}
    s = summarize(visibility(acks, [seen(2.0, {0: 2})]))
    assert (s["records"], s["visible"], s["never_visible"]) == (3, 2, 1)
    assert s["freshness_s"]["p50"] == pytest.approx(0.5)
    assert s["freshness_max_s"] == pytest.approx(1.0)
    assert s["commit_to_reader_s"]["p99"] == pytest.approx(0.1)


def test_offsets_going_back_are_counted_and_do_not_hide_records() -> None:
    snaps = [seen(2.0, {0: 5}), seen(3.0, {0: 3}), seen(4.0, {0: 6})]
    assert regressions(snaps) == 1
    (r,) = visibility({0: [(4, 1.0)]}, snaps)
    assert r.visible_at == 2.0  # a running max: the first snapshot that held it


def test_recovery_after_a_kill() -> None:
    # kill at 10: partition 1 (the victim's) acks again at 13; every partition has a
    # post-kill record visible at 15; the last late record (> 2 s) became visible at 16
    acks = {0: [(0, 9.0), (1, 10.5), (2, 14.5)], 1: [(0, 9.5), (1, 13.0)]}
    snaps = [seen(9.8, {0: 1, 1: 1}), seen(15.0, {0: 2, 1: 2}), seen(16.0, {0: 3, 1: 2})]
    k = recovery(visibility(acks, snaps), 10.0, 100.0, 2.0, [1])
    assert k["resume_s"] == pytest.approx(3.0)
    assert k["visible_again_s"] == pytest.approx(5.0)
    assert k["late_records"] == 1  # 10.5 -> 15.0
    assert k["settled_s"] == pytest.approx(5.0)
    assert k["freshness_max_s"] == pytest.approx(4.5)
    # records visible after the next kill (at 15.5) are that kill's
    early = recovery(visibility(acks, snaps), 10.0, 15.5, 2.0, [1])
    assert early["freshness_max_s"] == pytest.approx(4.5) and early["late_records"] == 1
    assert recovery(visibility(acks, snaps), 10.0, 14.0, 2.0, [1])["late_records"] == 0
    # a record acknowledged before the kill but not yet visible counts too
    pending = [seen(9.8, {0: 0, 1: 1}), *snaps[1:]]
    k = recovery(visibility(acks, pending), 10.0, 100.0, 2.0, [1])
    assert k["late_records"] == 2 and k["freshness_max_s"] == pytest.approx(6.0)
    lost = recovery(visibility(acks, snaps[:1]), 10.0, 100.0, 2.0, [1])
    assert lost["visible_again_s"] is None and lost["settled_s"] is None


def test_timeline_and_offsets() -> None:
    acks = {0: [(0, 0.2), (1, 0.7), (2, 1.5)]}
    rows = timeline(visibility(acks, [seen(1.0, {0: 2})]), 0.0)
    assert rows == [[0.0, 2, pytest.approx(0.8)], [1.0, 1, None]]
    assert parse_offsets('{"0": 5, "3": 7}') == {0: 5, 3: 7}
    assert parse_offsets(None) == {}


def test_leader_moves_and_snapshot_gaps() -> None:
    history = [
        {"at": 10.0, "node": 1, "partitions": {"0": [], "3": []}},
        {"at": 10.1, "node": 2, "partitions": {"1": []}},
        {"at": 12.0, "node": 2, "partitions": {"0": [], "1": []}},
        {"at": 12.1, "node": 1, "partitions": {"3": []}},
    ]
    assert leader_moves(history, 9.0) == [[3.0, 0, 1, 2]]
    g = gaps([seen(1.0, {}), seen(2.0, {}), seen(5.0, {})])
    assert g["max"] == pytest.approx(3.0) and g["p50"] == pytest.approx(1.0)


def test_rows_against_offsets() -> None:
    good = seen(1.0, {0: 3, 1: 4})
    assert row_mismatches([good]) == 0
    assert row_mismatches([good, Seen(2.0, 2, 1.9, {0: 3, 1: 4}, 8)]) == 1
