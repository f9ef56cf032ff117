"""A child Python run under strace: the system calls it made, optionally with faults or
delays injected (`strace -e inject=...`). The tests that use it need strace (./dev installs
it); in CI a skip fails the run (tests/ci_skips.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

STRACE = shutil.which("strace")
needs_strace = pytest.mark.skipif(STRACE is None, reason="needs strace (./dev installs it)")
CALLS = "trace=openat,writev,pwrite64,ftruncate,fcntl,fsync,fadvise64,close,rename"


def direct_io(directory: Path) -> bool:
    """Whether files in `directory` can be opened O_DIRECT (tmpfs, for one, refuses): the
    file store then writes the WAL around the page cache, else through it (_durable.c)."""
    probe = directory / ".direct-io-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


def traced(
    code: str, workdir: Path, start: str, *inject: str, only: Path | None = None
) -> tuple[str, list[str]]:
    """Run `code` (dedented) in a child Python under strace, following its threads, with the
    `inject` rules; its stdout and the file calls of CALLS it made from the first `openat`
    of a path containing `start` on (thread ids dropped). With `only`, the calls (and the
    injections: their `when` counts) are those on that path and its descriptors."""
    assert STRACE is not None, "strace is missing (./dev installs it)"
    log = workdir / "strace.log"
    argv = [STRACE, "-f", "-qq", "-o", str(log), "-e", CALLS]
    if only is not None:
        argv += ["-P", str(only)]
    for rule in inject:
        argv += ["-e", f"inject={rule}"]
    # no bytecode written by the child: its renames would meet the injected faults first
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([*argv, sys.executable, "-c", textwrap.dedent(code)],
                         capture_output=True, text=True, timeout=60, check=False, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if start in line and "openat" in line)
    return out.stdout, [re.sub(r"^\d+\s+", "", line) for line in lines[first:]]


def names(calls: list[str]) -> list[str]:
    """The system calls' names (strace's notes of signals and exits left out)."""
    return [c.split("(", 1)[0] for c in calls if not c.startswith(("+++", "---"))]
