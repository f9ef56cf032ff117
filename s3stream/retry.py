"""One retry policy for every "repeat an operation with backoff" in floe: object store requests
(s3stream.objectstore), the table writer's restarts and its catalog commit conflicts
(tabletopic), and Spark maintenance procedures losing a commit race (spark_compaction).

A `RetryPolicy` is a frozen value: how many attempts (or unbounded), a deadline (no retry is
scheduled to start later than `deadline` seconds after the first attempt began), exponential
backoff from `base_delay` doubling up to `max_delay`, `jitter` (the share of each delay drawn at
random: a delay d is drawn from [d * (1 - jitter), d], so the cap is a true cap) and
`retriable`, the predicate saying which errors are worth repeating. Anything else, and the last
error once the attempts or the deadline are spent, is raised as it was (with a note saying
how many attempts were made).

`run` (blocking) and `run_async` repeat a callable; `Attempts` is the same bookkeeping for a
loop that retries on its own terms (a service loop with an interruptible sleep): it says how
long to wait after each failure, or that it is time to give up. Sleep, clock and random source
are injectable, for tests. Every retry is logged (one line, at the policy's `log_level`; giving
up at ERROR) and may be counted through `on_retry`, which the callers turn into metrics.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Attempts", "RetryPolicy", "always"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Clock = Callable[[], float]
OnRetry = Callable[[BaseException], None]


def always(exc: BaseException) -> bool:
    """Every error is worth another attempt."""
    return True


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int | None = 6  # None: unbounded (then bounded by the deadline, if any)
    base_delay: float = 0.05  # seconds before the first retry (before jitter)
    max_delay: float = 2.0
    deadline: float | None = 30.0  # seconds from the first attempt; None: none
    jitter: float = 0.5  # 0: fixed delays; 0.5: each delay in [d/2, d]
    retriable: Callable[[BaseException], bool] = field(default=always, compare=False)
    log_level: int = logging.WARNING  # of the line logged per retry

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter}")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError("need 0 <= base_delay <= max_delay")

    def delay(self, retry: int, rand: float) -> float:
        """The wait before retry number `retry` (1 for the second attempt), `rand` in [0, 1]:
        d = min(max_delay, base_delay * 2**(retry-1)), of which `jitter` is random."""
        d = min(self.max_delay, self.base_delay * 2.0 ** min(retry - 1, 64))
        return d * (1.0 - self.jitter) + rand * d * self.jitter

    def attempts(
        self,
        what: str,
        *,
        clock: Clock = time.monotonic,
        rand: Callable[[], float] = random.random,
        on_retry: OnRetry | None = None,
        logger: logging.Logger = log,
    ) -> Attempts:
        """The bookkeeping of one retried operation, `what` naming it in log lines."""
        return Attempts(self, what, clock, rand, on_retry, logger)

    def run(
        self,
        fn: Callable[[], T],
        what: str,
        *,
        sleep: Callable[[float], object] = time.sleep,
        clock: Clock = time.monotonic,
        rand: Callable[[], float] = random.random,
        on_retry: OnRetry | None = None,
        logger: logging.Logger = log,
    ) -> T:
        """fn(), repeated after the policy's delays while it raises retriable errors."""
        tries = self.attempts(what, clock=clock, rand=rand, on_retry=on_retry, logger=logger)
        while True:
            try:
                return fn()
            except Exception as e:
                wait = tries.failed(e)
                if wait is None:
                    raise
            sleep(wait)

    async def run_async(
        self,
        fn: Callable[[], Awaitable[T]],
        what: str,
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        clock: Clock = time.monotonic,
        rand: Callable[[], float] = random.random,
        on_retry: OnRetry | None = None,
        logger: logging.Logger = log,
    ) -> T:
        """await fn(), repeated after the policy's delays while it raises retriable errors."""
        tries = self.attempts(what, clock=clock, rand=rand, on_retry=on_retry, logger=logger)
        while True:
            try:
                return await fn()
            except Exception as e:
                wait = tries.failed(e)
                if wait is None:
                    raise
            await sleep(wait)


class Attempts:
    """The attempts of one operation under a policy: `failed(e)` after each failure gives the
    delay before the next attempt, or None when `e` is to be raised (not retriable, attempts
    or deadline spent; a note on `e` then says so). `reset()` starts over (a loop that made
    progress)."""

    def __init__(
        self,
        policy: RetryPolicy,
        what: str,
        clock: Clock,
        rand: Callable[[], float],
        on_retry: OnRetry | None,
        logger: logging.Logger,
    ) -> None:
        self.policy = policy
        self.what = what
        self._clock = clock
        self._rand = rand
        self._on_retry = on_retry
        self._log = logger
        self.attempt = 1  # the number of the attempt under way
        self.started = clock()

    def reset(self) -> None:
        self.attempt = 1
        self.started = self._clock()

    def failed(self, exc: BaseException) -> float | None:
        p = self.policy
        if not p.retriable(exc):
            return None
        wait = p.delay(self.attempt, self._rand())
        elapsed = self._clock() - self.started
        spent = p.max_attempts is not None and self.attempt >= p.max_attempts
        if spent or (p.deadline is not None and elapsed + wait > p.deadline):
            self._log.error(
                "%s failed, giving up after %d attempts in %.1f s: %r",
                self.what, self.attempt, elapsed, exc,
            )
            exc.add_note(f"gave up after {self.attempt} attempts in {elapsed:.1f} s")
            return None
        of = f"/{p.max_attempts}" if p.max_attempts is not None else ""
        self._log.log(
            p.log_level, "%s failed (attempt %d%s), retrying in %.0f ms: %r",
            self.what, self.attempt, of, wait * 1000, exc,
        )
        if self._on_retry is not None:
            self._on_retry(exc)
        self.attempt += 1
        return wait
