"""s3stream.retry.RetryPolicy with a fake clock and sleep: attempts, deadline, backoff, jitter,
which errors are retried, the log line per retry and the retry hook."""

from __future__ import annotations

import asyncio
import logging

import pytest

from s3stream.retry import RetryPolicy


class FakeTime:
    """A clock that only moves when slept on; records every sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class Failing:
    """Raises errors[i] on call i (then returns "ok" when they are used up)."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


NO_JITTER = RetryPolicy(max_attempts=4, base_delay=0.1, max_delay=10.0, deadline=None, jitter=0)


def test_retriable_errors_are_retried_up_to_the_limit_then_the_last_is_raised() -> None:
    t = FakeTime()
    errors = [ConnectionError(f"e{i}") for i in range(10)]
    fn = Failing(*errors)
    retried: list[BaseException] = []
    with pytest.raises(ConnectionError) as info:
        NO_JITTER.run(fn, "op", sleep=t.sleep, clock=t.clock, on_retry=retried.append)
    assert fn.calls == 4 and info.value is errors[3]
    assert retried == errors[:3]
    assert t.sleeps == pytest.approx([0.1, 0.2, 0.4])
    assert "gave up after 4 attempts" in " ".join(info.value.__notes__)


def test_success_after_retries_returns_the_value() -> None:
    t = FakeTime()
    fn = Failing(TimeoutError(), TimeoutError())
    assert NO_JITTER.run(fn, "op", sleep=t.sleep, clock=t.clock) == "ok"
    assert fn.calls == 3 and len(t.sleeps) == 2


def test_a_non_retriable_error_is_raised_at_once() -> None:
    t = FakeTime()
    p = RetryPolicy(retriable=lambda e: isinstance(e, ConnectionError))
    fn = Failing(ValueError("bad"))
    with pytest.raises(ValueError, match="bad") as info:
        p.run(fn, "op", sleep=t.sleep, clock=t.clock)
    assert fn.calls == 1 and t.sleeps == []
    assert not getattr(info.value, "__notes__", [])


def test_the_deadline_is_honoured() -> None:
    """No retry is scheduled to start past the deadline, however many attempts are left."""
    t = FakeTime()
    p = RetryPolicy(max_attempts=None, base_delay=1.0, max_delay=1.0, deadline=3.5, jitter=0)
    fn = Failing(*[ConnectionError() for _ in range(100)])
    with pytest.raises(ConnectionError):
        p.run(fn, "op", sleep=t.sleep, clock=t.clock)
    assert t.sleeps == [1.0, 1.0, 1.0]  # a 4th wait would start the next attempt at 4.0 > 3.5
    assert fn.calls == 4 and t.now - 100.0 <= 3.5


def test_the_deadline_counts_the_time_attempts_take() -> None:
    t = FakeTime()
    p = RetryPolicy(max_attempts=None, base_delay=0.5, max_delay=0.5, deadline=5.0, jitter=0)
    calls = 0

    def slow() -> None:
        nonlocal calls
        calls += 1
        t.now += 2.0  # each attempt takes 2 s
        raise TimeoutError

    with pytest.raises(TimeoutError):
        p.run(slow, "op", sleep=t.sleep, clock=t.clock)
    # attempt 1 ends at 2 s, the retry would start at 2.5 s; attempt 2 ends at 4.5 s, the
    # retry at 5.0 s (still within); attempt 3 ends at 7 s: past the deadline, given up
    assert calls == 3 and t.sleeps == [0.5, 0.5]


def test_backoff_grows_and_is_capped() -> None:
    p = RetryPolicy(base_delay=0.1, max_delay=1.0, jitter=0)
    assert [p.delay(n, 0.7) for n in range(1, 8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    )
    assert p.delay(10_000, 0.5) == 1.0  # no overflow for a long-running loop


def test_jitter_is_bounded() -> None:
    p = RetryPolicy(base_delay=0.4, max_delay=2.0, jitter=0.5)
    assert p.delay(1, 0.0) == pytest.approx(0.2) and p.delay(1, 1.0) == pytest.approx(0.4)
    assert p.delay(9, 0.0) == pytest.approx(1.0) and p.delay(9, 1.0) == pytest.approx(2.0)
    t = FakeTime()
    fn = Failing(*[ConnectionError() for _ in range(5)])
    RetryPolicy(max_attempts=6, base_delay=0.4, max_delay=2.0, deadline=None).run(
        fn, "op", sleep=t.sleep, clock=t.clock
    )
    for n, s in enumerate(t.sleeps, 1):
        d = min(2.0, 0.4 * 2 ** (n - 1))
        assert d / 2 <= s <= d


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=1.5)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=3.0, max_delay=1.0)


def test_async_run_logs_one_line_per_retry(caplog: pytest.LogCaptureFixture) -> None:
    t = FakeTime()
    calls = 0

    async def fn() -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionResetError("reset by peer")
        return 7

    async def main() -> int:
        return await NO_JITTER.run_async(fn, "object store PUT 'k'", sleep=t.asleep,
                                         clock=t.clock)

    with caplog.at_level(logging.INFO, logger="s3stream.retry"):
        assert asyncio.run(main()) == 7
    lines = [r.getMessage() for r in caplog.records if r.name == "s3stream.retry"]
    assert len(lines) == 2
    assert lines[0].startswith("object store PUT 'k' failed (attempt 1/4), retrying in 100 ms")
    assert "reset by peer" in lines[1] and "attempt 2/4" in lines[1]


def test_attempts_for_a_loop_reset_after_progress() -> None:
    t = FakeTime()
    p = RetryPolicy(max_attempts=None, base_delay=0.2, max_delay=5.0, deadline=None, jitter=0)
    tries = p.attempts("table topic t", clock=t.clock)
    waits = [tries.failed(RuntimeError()) for _ in range(7)]
    assert waits == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    tries.reset()
    assert tries.failed(RuntimeError()) == pytest.approx(0.2)


# -- the sites that use it ------------------------------------------------------------------
class FakeSpark:
    """spark.sql(query).collect() raising errors[i] on call i, then returning one row."""

    class Row:
        def asDict(self) -> dict[str, int]:  # pyspark's name
            return {"rewritten": 3}

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def sql(self, query: str) -> FakeSpark:
        self.calls += 1
        return self

    def collect(self) -> list[FakeSpark.Row]:
        if self.errors:
            raise self.errors.pop(0)
        return [self.Row()]


def test_spark_procedures_are_rerun_after_commit_conflicts_only() -> None:
    from dataclasses import replace

    from spark_compaction.jobs import COMMIT_ATTEMPTS, COMMIT_RETRY, _call

    quick = replace(COMMIT_RETRY, base_delay=0.0, max_delay=0.0)
    conflict = RuntimeError("org.apache.iceberg.exceptions.CommitFailedException: lost")
    spark = FakeSpark(conflict, conflict)
    assert _call(spark, "CALL x.system.rewrite_data_files(t)", quick) == (  # type: ignore[arg-type]
        [{"rewritten": 3}], 3
    )
    spark = FakeSpark(*[conflict] * 10)
    with pytest.raises(RuntimeError):
        _call(spark, "CALL x", quick)  # type: ignore[arg-type]
    assert spark.calls == COMMIT_ATTEMPTS == 5
    spark = FakeSpark(RuntimeError("AnalysisException: no such table"))
    with pytest.raises(RuntimeError, match="no such table"):
        _call(spark, "CALL x", quick)  # type: ignore[arg-type]
    assert spark.calls == 1
    assert COMMIT_RETRY.delay(10, 1.0) == 5.0  # the cap holds, jitter included
