"""Start and stop a real `floe broker` process for integration tests.

The broker is launched as a separate process (`python -m broker.cli broker ...`), binds port 0
on 127.0.0.1 and announces its address on one line `listening on HOST:PORT`. Its admin port
(/metrics, /status) binds port 0 too unless `admin_listen` says otherwise (None: the broker's
default 127.0.0.1:9644, for the one test of defaults), announced as `metrics on HOST:PORT`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 30.0


@dataclass
class BrokerProcess:
    data_dir: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[str] | None = None
    address: str = ""
    output: list[str] = field(default_factory=list)
    listen: str = "127.0.0.1:0"
    admin_listen: str | None = "127.0.0.1:0"
    admin: str = ""  # the admin HOST:PORT once the broker printed it (see admin_address)
    registry_listen: str | None = ""  # --schema-registry: "" off, "127.0.0.1:0" any port
    registry: str = ""  # the registry's HOST:PORT once printed (`schema registry on ...`)
    _pump: threading.Thread = field(init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        return self.address

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def start(self) -> BrokerProcess:
        cmd = [
            sys.executable,
            "-m",
            "broker.cli",
            "broker",
            "--listen",
            self.listen,
            "--data-dir",
            str(self.data_dir),
            *(["--metrics", self.admin_listen] if self.admin_listen is not None else []),
            *(["--schema-registry", self.registry_listen]
              if self.registry_listen is not None else []),
            *self.extra_args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env = {k: v for k, v in env.items() if not (v == "" and k in self.env)}  # "" unsets
        self.output = []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        found = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if not found.is_set() and line.startswith("listening on "):
                    self.address = line.split("listening on ", 1)[1].strip()
                    found.set()
                elif line.startswith("schema registry on "):
                    self.registry = line.split("schema registry on ", 1)[1].strip()
                elif line.startswith("metrics on "):
                    self.admin = line.split("metrics on ", 1)[1].strip()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("broker did not start:\n" + "".join(self.output))
        # later restarts reuse the same port so clients' bootstrap lists stay valid
        self.listen = self.address
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.proc is None:
            return
        self.proc.wait(10)
        self._pump.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def log(self) -> str:
        return "".join(self.output)

    def admin_address(self, timeout: float = 10.0) -> str:
        """The admin port's HOST:PORT (printed just after `listening on`)."""
        deadline = time.monotonic() + timeout
        while not self.admin:
            if time.monotonic() > deadline:
                raise RuntimeError("broker printed no `metrics on` line:\n" + self.log())
            time.sleep(0.02)
        return self.admin


@contextmanager
def running_broker(data_dir: Path, *args: str, **env: str) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(data_dir=data_dir, extra_args=list(args), env=dict(env)).start()
    try:
        yield broker
    finally:
        broker.stop()
