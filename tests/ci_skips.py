"""In CI nothing skips silently: a test that would be skipped fails, with the skip's reason.

Loaded for every run (its hooks are imported by tests/conftest.py). Outside CI skips stay skips, and
`./dev test` prints every skip with its reason (`-rs`). CI is any non-empty `CI` variable other
than 0/false/no (`.ci/run` sets CI=true). A test may only skip in CI if it is marked
`@pytest.mark.ci_may_skip("why that is not a missing tool")`; none is today.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_skip(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    reason = _skip_reason(report)
    report.outcome = "failed"
    report.longrepr = f"{what} would be skipped ({reason}); CI is set, so this is a failure"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (
        in_ci()
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("ci_may_skip") is None
    ):
        _fail_skip(report, item.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if in_ci() and report.skipped:  # pytest.skip(..., allow_module_level=True)
        _fail_skip(report, collector.nodeid)
    return report


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ci_may_skip(reason): this test may skip even in CI (not a missing tool)"
    )
