"""The systems under test, each started as its own process on 127.0.0.1:

- `null`: floe's own broker with the null storage engine (`--object-store null://`: same
  front end, acknowledges without storing): the protocol ceiling;
- `floe-file`: floe with its default local-directory object store and SQLite metadata;
- `floe-s3`: floe with its log on moto's S3 server;
- `tansu-memory`: Tansu's memory engine; `tansu-s3`: Tansu on the same moto server.

Every broker runs with its defaults otherwise; a system can be restarted on the same data
(floe-file, floe-s3, tansu-s3) for cold catch-up reads.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.motoproc import MOTO_ENV, create_bucket, object_sizes
from benchmarks.procs import Proc, Processes, free_port
from benchmarks.procstat import ProcSample

FLOE_FILE, FLOE_S3, TANSU_MEMORY, TANSU_S3, NULL = (
    "floe-file",
    "floe-s3",
    "tansu-memory",
    "tansu-s3",
    "null",
)
PEER = {FLOE_FILE: TANSU_MEMORY, FLOE_S3: TANSU_S3}  # our system -> the Tansu run it faces
DURABLE_AFTER_RESTART = {FLOE_FILE, FLOE_S3, TANSU_S3}


@dataclass
class Moto:
    proc: Proc

    @property
    def endpoint(self) -> str:
        return f"http://{self.proc.address}"


@dataclass
class System:
    name: str
    procs: Processes
    data_dir: Path
    tansu: Path | None = None
    moto: Moto | None = None
    metrics: bool = False
    floe_root: Path | None = None  # run the floe broker of this checkout (default: ours)
    bucket: str = ""  # S3 systems: created on first start
    proc: Proc | None = None
    port: int = 0
    peak: list[ProcSample] = field(default_factory=list)
    written: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # parts, acked, size
    wal_sizes: list[int] = field(default_factory=list)  # WAL objects of the catch-up workload
    _bucket_made: bool = False

    @property
    def bootstrap(self) -> str:
        assert self.proc is not None
        return self.proc.address

    @property
    def metrics_address(self) -> str | None:
        assert self.proc is not None
        return self.proc.line_matching(r"metrics on (\S+)")

    @property
    def object_store_url(self) -> str:
        """Where a floe system keeps its objects (for the raw object-store ceilings)."""
        if self.name == FLOE_S3:
            assert self.moto is not None
            return f"s3://{self.bucket}/log?endpoint={self.moto.endpoint}&region=us-east-1"
        return (self.data_dir / "objects").resolve().as_uri()

    def start(self) -> System:
        if self.name in (FLOE_FILE, FLOE_S3, NULL):
            self._start_floe()
        else:
            self._start_tansu()
        return self

    def _start_floe(self) -> None:
        listen = f"127.0.0.1:{self.port}" if self.port else "127.0.0.1:0"
        cmd = [
            sys.executable,
            "-m",
            "broker.cli",
            "broker",
            "--listen",
            listen,
            "--data-dir",
            str(self.data_dir.resolve()),
            "--log-level",
            "warning",
        ]
        env: dict[str, str] = {}
        if self.metrics:
            cmd += ["--metrics", "127.0.0.1:0"]
        if self.name == NULL:
            cmd += ["--object-store", "null://"]
        if self.name == FLOE_S3:
            assert self.moto is not None
            if not self._bucket_made:
                self.bucket = self.bucket or "floe"
                create_bucket(self.moto.endpoint, self.bucket)
                self._bucket_made = True
            cmd += ["--object-store", self.object_store_url]
            env = dict(MOTO_ENV)
        wait_for = "metrics on" if self.metrics else "listening"
        cwd = None
        if self.floe_root is not None and self.name != NULL:  # the ceiling: this tree's
            # `python -m` puts the working directory first
            cwd = self.floe_root
            env["PYTHONPATH"] = str(self.floe_root)
        self.proc = self.procs.start(self.name, cmd, env=env, wait_for=wait_for, cwd=cwd)
        self.port = int(self.bootstrap.rsplit(":", 1)[1])

    def _start_tansu(self) -> None:
        assert self.tansu is not None
        self.port = self.port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        env: dict[str, str] = {}
        engine = "memory://tansu/"
        if self.name == TANSU_S3:
            assert self.moto is not None
            if not self._bucket_made:
                self.bucket = self.bucket or "tansu"
                create_bucket(self.moto.endpoint, self.bucket)
                self._bucket_made = True
            engine = f"s3://{self.bucket}/"
            env = {**MOTO_ENV, "AWS_ENDPOINT": self.moto.endpoint, "AWS_ALLOW_HTTP": "true"}
        cmd = [
            str(self.tansu),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            engine,
        ]
        self.proc = self.procs.start(self.name, cmd, env=env, wait_for="listening on")
        wait_port(self.port)

    def list_wal_sizes(self) -> list[int]:
        """Sizes of the WAL objects a floe system holds now (what its flusher PUT)."""
        if self.name == FLOE_S3:
            assert self.moto is not None
            return sorted(object_sizes(self.moto.endpoint, self.bucket, "log/wal/").values())
        wal = self.data_dir / "objects" / "wal"
        if not wal.is_dir():
            return []
        return sorted(p.stat().st_size for p in wal.iterdir() if not p.name.endswith(".tmp"))

    def problems(self, limit: int = 5) -> str:
        """Lines of the broker's log that look like a crash or an error."""
        if self.proc is None:
            return ""
        try:
            text = self.proc.log_path.read_text(errors="replace")
        except OSError:
            return ""
        keys = ("panicked", "panic", "ERROR", "Traceback", "not yet implemented")
        hits = [line for line in text.splitlines() if any(k in line for k in keys)]
        return "\n".join(hits[:limit])

    def sample(self) -> ProcSample | None:
        return self.proc.sample() if self.proc is not None else None

    def stop(self) -> None:
        """Stop the broker (remembering its peak RSS)."""
        if self.proc is None:
            return
        s = self.proc.sample()
        if s is not None:
            self.peak.append(s)
        self.procs.stop(self.proc)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def peak_rss_bytes(self) -> int:
        now = self.sample()
        samples = [s.peak_rss_bytes for s in self.peak] + ([now.peak_rss_bytes] if now else [])
        return max(samples, default=0)  # 0: the broker never ran


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    """Until 127.0.0.1:port accepts a connection (bounded)."""
    import socket
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing accepts connections on 127.0.0.1:{port}")


def start_moto(procs: Processes) -> Moto:
    cmd = [sys.executable, "-m", "benchmarks.motoproc", "--listen", "127.0.0.1:0"]
    return Moto(procs.start("moto", cmd))
