"""The `floe broker` child processes of a local cluster: start, readiness, stop.

Each broker runs in its own session (process group), so a Ctrl-C in the terminal reaches only
the launcher, which then stops the brokers itself, in order. Output goes to
<data-dir>/broker.log. Stopping sends SIGTERM to the broker's process group, waits, then
SIGKILLs whatever is left of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from broker.client import Client, KafkaClientError
from broker.localcluster.plan import BrokerSpec

API_VERSIONS = 18
METADATA = 3
PROBE_TIMEOUT_S = 2.0


class StartError(RuntimeError):
    """A broker exited or did not answer in time while the cluster started."""


@dataclass
class BrokerProcess:
    spec: BrokerSpec
    args: list[str]
    env: Mapping[str, str]
    proc: subprocess.Popen[bytes] | None = None
    exit_reported: bool = field(default=False)

    @property
    def log_path(self) -> Path:
        return self.spec.data_dir / "broker.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.spec.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "broker.cli", "broker", *self.args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(self.env), start_new_session=True, cwd=self.spec.data_dir,
            )

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def answers(self, cluster: frozenset[int] = frozenset()) -> bool:
        """True when both the Kafka port (ApiVersions) and the admin port (/status) answer, and
        the broker's Metadata lists every broker of `cluster` (node ids): a client may then
        bootstrap from any of them and learn the whole cluster."""
        try:
            with Client(self.spec.listen, timeout=PROBE_TIMEOUT_S, client_id="local-cluster") as c:
                if c.request(API_VERSIONS, 0).error_code != 0:
                    return False
                if cluster:
                    md = c.request(METADATA, 9, topics=(), allow_auto_topic_creation=False,
                                   include_cluster_authorized_operations=False,
                                   include_topic_authorized_operations=False)
                    if not cluster <= {int(b.node_id) for b in md.brokers}:
                        return False
            url = f"http://{self.spec.metrics}/status"
            with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:
                return int(resp.status) == 200
        except (OSError, KafkaClientError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "".join(text.splitlines(keepends=True)[-lines:])

    def signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # start_new_session: its pid is its group's id


def wait_ready(
    brokers: Sequence[BrokerProcess], timeout_s: float, stop: threading.Event
) -> None:
    """Until every broker answers and lists every other in its Metadata (each has seen the
    others join); StartError if one exits or the time is up. Returns early, without error, when
    `stop` is set (a signal arrived while starting)."""
    deadline = time.monotonic() + timeout_s
    cluster = frozenset(b.spec.node_id for b in brokers)
    waiting = list(brokers)
    while waiting:
        for b in list(waiting):
            code = b.exit_code()
            if code is not None:
                raise StartError(f"broker {b.spec.node_id} exited with code {code} while "
                                 f"starting; its log ({b.log_path}) ends:\n{b.log_tail()}")
            if b.answers(cluster):
                waiting.remove(b)
        if not waiting or stop.is_set():
            return
        if time.monotonic() > deadline:
            names = ", ".join(str(b.spec.node_id) for b in waiting)
            raise StartError(f"broker(s) {names} did not answer (or did not list every"
                             f" broker) within {timeout_s:g} s; "
                             f"broker {waiting[0].spec.node_id}'s log ends:\n"
                             f"{waiting[0].log_tail()}")
        stop.wait(0.2)


def stop_brokers(brokers: Sequence[BrokerProcess], grace_s: float) -> None:
    """SIGTERM every broker, wait up to `grace_s`, then SIGKILL what is left of each group."""
    started = [b for b in brokers if b.proc is not None]
    for b in started:
        if b.exit_code() is None:
            b.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for b in started:
        assert b.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            b.proc.wait(max(0.0, deadline - time.monotonic()))
    for b in started:
        assert b.proc is not None
        if b.proc.poll() is None:
            print(f"broker {b.spec.node_id} (pid {b.pid}) did not stop within {grace_s:g} s: "
                  "SIGKILL", file=sys.stderr, flush=True)
        b.signal_group(signal.SIGKILL)  # also any child a broker left behind
        b.proc.wait(10)
