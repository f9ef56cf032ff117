"""Processes the benchmark starts: each announces `listening on HOST:PORT` on stdout (Tansu says
`listening on: tcp://HOST:PORT`), is watched through /proc, and is always stopped.

`Processes` is the one owner: everything started goes through it, and closing it (also on an
exception or Ctrl-C) terminates whatever is still running, then kills what does not exit.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.procstat import ProcSample, sample

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
_LISTEN = re.compile(r"listening on:? (?:tcp://)?(\S+?:\d+)")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    log_path: Path
    address: str = ""
    lines: list[str] = field(default_factory=list)
    _pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send_line(self, text: str) -> None:
        """Write one line to the process's stdin (started with stdin_pipe)."""
        stdin = self.popen.stdin
        if stdin is not None and self.alive():
            try:
                stdin.write(text + "\n")
                stdin.flush()
            except OSError:
                pass

    def wait(self, timeout: float) -> int | None:
        """Wait for the exit (bounded); None if still running."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def sample(self) -> ProcSample | None:
        return sample(self.pid) if self.alive() else None

    def line_matching(self, pattern: str) -> str | None:
        rx = re.compile(pattern)
        for line in list(self.lines):
            m = rx.search(line)
            if m:
                return m.group(1)
        return None

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        env: dict[str, str] | None = None,
        wait_for: str | None = "listening",
        timeout: float = START_TIMEOUT_S,
        stdin_pipe: bool = False,
        cwd: Path | None = None,
    ) -> Proc:
        """Start `cmd`; with `wait_for`, block until a stdout line contains it (bounded)."""
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "w")  # noqa: SIM115 - closed when the pump ends
        popen = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=cwd,
        )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        seen = threading.Event()

        def pump() -> None:
            assert popen.stdout is not None
            try:
                for line in popen.stdout:
                    proc.lines.append(line.rstrip("\n"))
                    log.write(line)
                    log.flush()
                    m = _LISTEN.search(line)
                    if m and not proc.address:
                        proc.address = m.group(1)
                    if wait_for is not None and wait_for in line:
                        seen.set()
            finally:
                log.close()

        proc._pump = threading.Thread(target=pump, daemon=True, name=f"pump {name}")
        proc._pump.start()
        if wait_for is not None:
            deadline = time.monotonic() + timeout
            while not seen.wait(0.05):
                if popen.poll() is not None or time.monotonic() > deadline:
                    self.stop(proc)
                    raise RuntimeError(
                        f"{name} did not start (exit {popen.returncode}):\n{proc.tail()}"
                    )
        return proc

    def stop(self, proc: Proc, sig: int = signal.SIGTERM) -> int | None:
        """Signal, wait (bounded), kill if needed; returns the exit code."""
        p = proc.popen
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(STOP_TIMEOUT_S)
        if proc._pump is not None:
            proc._pump.join(5)
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
        if proc in self.procs:
            self.procs.remove(proc)
        return p.returncode

    def close(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
