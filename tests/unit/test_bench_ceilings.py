"""benchmarks.ceilings.put_latency on a real local store, and the S3 fixed-rate bound
(issue 17: produce p99 <= 2 x the store's PUT p99 + the flush interval) in apply_ceilings."""

from __future__ import annotations

from pathlib import Path

from benchmarks.ceilings import put_latency
from benchmarks.figures import FLUSH_INTERVAL_MS, apply_ceilings
from benchmarks.results import Results
from benchmarks.systems import FLOE_FILE, FLOE_S3, NULL


def test_put_latency_times_sequential_puts_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    r = put_latency(root.as_uri(), 4096, count=10)
    assert r.error == "" and r.puts == 10 and r.size == 4096
    assert 0 < r.p50_ms <= r.p99_ms
    assert not any(p.is_file() for p in root.rglob("*")), "its objects are deleted"


def test_put_latency_reports_a_store_it_cannot_use() -> None:
    r = put_latency("nosuch://x", 10, count=2)
    assert r.puts == 0 and r.error


def _results(with_put: bool) -> Results:
    res = Results(quick=False, started="")
    for system, p99 in ((NULL, 10.0), (FLOE_FILE, 90.0), (FLOE_S3, 150.0)):
        res.add(system, "fixed-1k-16p", "produce_p99_ms", p99, "ms", False)
        res.add(system, "fixed-1k-16p", "produce_p50_ms", p99 / 2, "ms", False)
    if with_put:
        res.add("raw-s3", "fixed-1k-16p", "put_p99_ms", 20.0, "ms", False)
    apply_ceilings(res)
    return res


def test_s3_fixed_rate_p99_is_measured_against_twice_the_put_p99_plus_the_interval() -> None:
    res = _results(with_put=True)
    s3 = res.get(FLOE_S3, "fixed-1k-16p", "produce_p99_ms")
    assert s3 is not None and s3.ceiling == 2 * 20.0 + FLUSH_INTERVAL_MS
    assert "raw PUT p99" in s3.ceiling_source and s3.ratio == 150.0 / s3.ceiling
    # the other latency figures keep the null broker's floor
    for system, metric in ((FLOE_FILE, "produce_p99_ms"), (FLOE_S3, "produce_p50_ms")):
        f = res.get(system, "fixed-1k-16p", metric)
        assert f is not None and f.ceiling_source == "null broker (floor)"


def test_without_the_put_figure_the_null_floor_stays() -> None:
    s3 = _results(with_put=False).get(FLOE_S3, "fixed-1k-16p", "produce_p99_ms")
    assert s3 is not None and s3.ceiling == 10.0 and s3.ceiling_source == "null broker (floor)"
