"""A stream's commit times (s3stream.index `Stream.committed` / `commit_time`), what table
freshness and lag are measured from: commits within COMMIT_TICK_S share one entry holding the
first one's time (an offset's time is never late, at most one tick early), and a stream
committed without pause keeps COMMIT_TIMES entries, not one per WAL commit."""

from __future__ import annotations

from s3stream.index import COMMIT_TICK_S, COMMIT_TIMES, Stream


def stream() -> Stream:
    return Stream(stream_id=1, start_offset=0, end_offset=0, next_offset=0)


def test_each_offset_gets_the_time_it_became_durable() -> None:
    st = stream()
    st.committed(10, 100.0)  # offsets 0-9
    st.committed(25, 101.0)  # 10-24
    assert st.commit_time(0) == st.commit_time(9) == 100.0
    assert st.commit_time(10) == st.commit_time(24) == 101.0
    assert st.commit_time(25) is None  # not durable yet


def test_commits_within_a_tick_share_the_first_ones_time() -> None:
    st = stream()
    st.committed(10, 100.0)
    st.committed(20, 100.0 + COMMIT_TICK_S / 2)  # same tick: the entry moves its end
    st.committed(30, 100.0 + COMMIT_TICK_S * 1.5)  # a new entry
    assert len(st.commits) == 2
    assert st.commit_time(15) == 100.0  # at most one tick early, never late
    assert st.commit_time(25) == 100.0 + COMMIT_TICK_S * 1.5
    assert st.commit_time(30) is None


def test_a_stream_committed_without_pause_keeps_a_bounded_window() -> None:
    st = stream()
    commits_per_s = 200  # the WAL's commits under load (a 5 ms flush interval)
    n = int(COMMIT_TIMES * COMMIT_TICK_S * commits_per_s * 2)
    for i in range(n):
        st.committed(i + 1, 1000.0 + i / commits_per_s)
    assert len(st.commits) == COMMIT_TIMES  # not one entry per commit
    newest = 1000.0 + (n - 1) / commits_per_s
    assert newest - COMMIT_TICK_S <= st.commit_time(n - 1) <= newest  # type: ignore[operator]
    assert st.commit_time(n) is None
