"""The compaction policy: pure decisions from table stats (no Spark)."""

from __future__ import annotations

import pytest

from spark_compaction.policy import Decision, MiB, TableStats, Thresholds, decide

NOW = 1_800_000_000_000
HOUR_MS = 3_600_000
T = Thresholds()


def stats(**kw: object) -> TableStats:
    base: dict[str, object] = {"table": "default.t", "snapshots": 1, "oldest_snapshot_ms": NOW}
    base.update(kw)
    return TableStats(**base)  # type: ignore[arg-type]


def test_a_fresh_small_table_needs_nothing_but_the_first_orphan_look() -> None:
    d = decide(stats(data_files=3, data_bytes=3 * MiB, small_data_files=3, manifests=3), T,
               NOW, last_orphan_run_ms=NOW - 1000)
    assert d == Decision("default.t")
    assert not d.any and d.jobs == []


def test_many_small_files_are_rewritten() -> None:
    d = decide(stats(data_files=25, data_bytes=25 * MiB, small_data_files=25), T, NOW, NOW)
    assert d.rewrite_data_files and d.jobs == ["rewrite_data_files"]
    assert "25 small data files" in d.reasons["rewrite_data_files"]


def test_small_file_count_threshold_is_inclusive() -> None:
    t = Thresholds(min_small_files=10)
    assert decide(stats(small_data_files=10, data_files=10), t, NOW, NOW).rewrite_data_files
    assert not decide(stats(small_data_files=9, data_files=9), t, NOW, NOW).rewrite_data_files


def test_many_files_with_a_low_average_size_are_rewritten() -> None:
    # few files below the small-file size, but many files averaging less than the minimum
    s = stats(data_files=60, data_bytes=60 * 40 * MiB, small_data_files=0)
    d = decide(s, T, NOW, NOW)
    assert d.rewrite_data_files and "averaging 40.0 MiB" in d.reasons["rewrite_data_files"]
    big = stats(data_files=60, data_bytes=60 * 200 * MiB, small_data_files=0)
    assert not decide(big, T, NOW, NOW).rewrite_data_files


def test_many_manifests_are_rewritten() -> None:
    assert decide(stats(manifests=51), T, NOW, NOW).jobs == ["rewrite_manifests"]
    assert not decide(stats(manifests=50), T, NOW, NOW).any


def test_snapshots_past_the_count_are_expired() -> None:
    d = decide(stats(snapshots=501, oldest_snapshot_ms=NOW - 1000), T, NOW, NOW)
    assert d.jobs == ["expire_snapshots"] and "501 snapshots" in d.reasons["expire_snapshots"]


def test_old_snapshots_are_expired_only_past_the_slack() -> None:
    s_ok = stats(snapshots=100, oldest_snapshot_ms=NOW - int(1.2 * HOUR_MS))
    assert not decide(s_ok, T, NOW, NOW).expire_snapshots  # within 1h * 1.25
    s_old = stats(snapshots=100, oldest_snapshot_ms=NOW - int(1.3 * HOUR_MS))
    assert decide(s_old, T, NOW, NOW).expire_snapshots


def test_never_expire_at_or_below_retain_last() -> None:
    t = Thresholds(retain_last=20, max_snapshots=10)
    old = NOW - 100 * HOUR_MS
    assert not decide(stats(snapshots=20, oldest_snapshot_ms=old), t, NOW, NOW).expire_snapshots
    assert decide(stats(snapshots=21, oldest_snapshot_ms=old), t, NOW, NOW).expire_snapshots


def test_orphans_are_looked_for_once_per_interval() -> None:
    t = Thresholds(orphan_interval_s=3600)
    assert decide(stats(), t, NOW, None).remove_orphan_files  # never looked
    assert not decide(stats(), t, NOW, NOW - HOUR_MS + 1).remove_orphan_files
    assert decide(stats(), t, NOW, NOW - HOUR_MS).remove_orphan_files


def test_jobs_come_in_a_safe_order() -> None:
    s = stats(data_files=100, data_bytes=100, small_data_files=100, manifests=100,
              snapshots=1000, oldest_snapshot_ms=NOW - 10 * HOUR_MS)
    d = decide(s, T, NOW, None)
    assert d.jobs == ["rewrite_data_files", "rewrite_manifests", "expire_snapshots",
                      "remove_orphan_files"]
    assert list(d.reasons) == d.jobs


def test_average_file_size_of_an_empty_table() -> None:
    assert stats().avg_file_bytes == 0.0
    assert stats(data_files=4, data_bytes=4 * MiB).avg_file_bytes == MiB


@pytest.mark.parametrize("bad", [{"retain_last": 0}, {"min_small_files": 0},
                                 {"max_snapshot_age_s": -1}, {"small_file_bytes": 0}])
def test_bad_thresholds_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Thresholds(**bad)  # type: ignore[arg-type]
