"""With CI set, a test that would skip (a missing tool) fails the run instead; without CI it
skips and the summary names the reason. Runs pytest in a subprocess on a throwaway test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SKIPPING = '''
import pytest
import shutil

def test_needs_a_tool():
    if shutil.which("surely-not-installed-tool") is None:
        pytest.skip("surely-not-installed-tool is missing")

@pytest.mark.skipif(True, reason="marker skip")
def test_marker():
    pass

def test_passes():
    pass
'''

MODULE_SKIP = '''
import pytest
pytest.skip("the whole module needs a tool", allow_module_level=True)

def test_never_runs():
    pass
'''


def _run(tmp_path: Path, source: str, ci: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_probe.py"
    test.write_text(source)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "tests.ci_skips", "-p",
         "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull, str(test)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )


@pytest.mark.parametrize("source", [SKIPPING, MODULE_SKIP], ids=["in-test", "module-level"])
def test_skips_fail_in_ci(tmp_path: Path, source: str) -> None:
    r = _run(tmp_path, source, "true")
    assert r.returncode in (1, 2), r.stdout + r.stderr  # 2: a collection error stops the run
    assert "CI is set, so this is a failure" in r.stdout
    assert "skipped" not in r.stdout.splitlines()[-1]


def test_skips_are_listed_with_reasons_outside_ci(tmp_path: Path) -> None:
    r = _run(tmp_path, SKIPPING, "")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "surely-not-installed-tool is missing" in r.stdout
    assert "marker skip" in r.stdout
    assert "1 passed, 2 skipped" in r.stdout
