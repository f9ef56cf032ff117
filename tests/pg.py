"""A throwaway PostgreSQL cluster for tests: initdb + pg_ctl in a temp dir, 127.0.0.1, free port.

`pg_cluster` (session) starts it once; `pg_url` (per test) hands out a fresh database in it.
When the server binaries are missing the tests that need them are skipped, unless the CI
environment variable is set: then a missing PostgreSQL fails the run instead of silently
testing less. Binaries are looked up in $FLOE_PG_BINDIR, on PATH, then in Debian's
/usr/lib/postgresql/<version>/bin. initdb refuses to run as root, so as root the cluster
belongs to (and the server runs as) the `postgres` system user.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

USER = "floe"
PASSWORD = "floe-test-secret"
_db_numbers = itertools.count(1)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_bindir() -> Path | None:
    candidates = []
    if os.environ.get("FLOE_PG_BINDIR"):
        candidates.append(Path(os.environ["FLOE_PG_BINDIR"]))
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).parent)
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += [Path(p) for p in debian]
    for d in candidates:
        if all(os.access(d / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgCluster:
    bindir: Path
    datadir: Path
    port: int
    run_as: str | None  # a system user to run the server binaries as (when we are root)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def _cmd(self, *args: str) -> list[str]:
        if self.run_as is None:
            return list(args)
        if shutil.which("runuser"):
            return ["runuser", "-u", self.run_as, "--", *args]
        return ["su", self.run_as, "-s", "/bin/sh", "-c", shlex.join(args)]

    def _run(self, *args: str) -> None:
        # cwd: the postgres user may not be allowed into ours
        out = subprocess.run(self._cmd(*args), capture_output=True, text=True, cwd="/",
                             timeout=120)
        if out.returncode != 0:
            log = self.datadir.parent / "server.log"
            server_log = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise RuntimeError(f"{shlex.join(args)} failed ({out.returncode}):\n{out.stdout}"
                               f"{out.stderr}\n--- server log ---\n{server_log}")

    def pg_ctl(self, action: str, *args: str) -> None:
        log = str(self.datadir.parent / "server.log")
        self._run(str(self.bindir / "pg_ctl"), action, "-D", str(self.datadir), "-l", log,
                  "-w", "-t", "60", *args)

    def init(self) -> None:
        pwfile = self.datadir.parent / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        self._chown(pwfile)
        self._run(str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", USER,
                  f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.datadir.parent}'",
            "fsync": "off",  # a throwaway cluster: the server process is never crashed
            "full_page_writes": "off",
            "max_connections": "100",
        }
        with (self.datadir / "postgresql.conf").open("a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in settings.items())

    def start(self) -> None:
        self.pg_ctl("start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("stop", "-m", mode)

    def restart(self) -> None:
        self.pg_ctl("restart", "-m", "fast")

    def running(self) -> bool:
        cmd = self._cmd(str(self.bindir / "pg_ctl"), "status", "-D", str(self.datadir))
        return subprocess.run(cmd, capture_output=True, cwd="/", timeout=30).returncode == 0

    def ensure_running(self) -> None:
        """Start the server again if a test stopped it and failed before restarting it."""
        if not self.running():
            self.start()

    def _chown(self, path: Path) -> None:
        if self.run_as is not None:
            pw = pwd.getpwnam(self.run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def admin(self, sql: str) -> None:
        """Run one statement as the superuser (autocommit: CREATE DATABASE needs that)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.encode())

    def new_database(self) -> str:
        name = f"floe_test_{next(_db_numbers)}"
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)


def _start_cluster() -> PgCluster:
    bindir = find_bindir()
    run_as = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
            run_as = "postgres"
        except KeyError:
            bindir = None  # initdb refuses root and there is nobody else to run it as
    if bindir is None:
        why = "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found"
        if os.geteuid() == 0 and run_as is None:
            why = "running as root and there is no 'postgres' user to run PostgreSQL as"
        if in_ci():
            pytest.fail(f"{why}; CI is set, so this fails instead of skipping", pytrace=False)
        pytest.skip(why)
    top = Path(tempfile.mkdtemp(prefix="floe-pg-"))
    cluster = PgCluster(bindir, top / "data", free_port(), run_as)
    cluster._chown(top)
    cluster.init()
    cluster.start()
    return cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One PostgreSQL server for the whole test session, stopped and deleted at the end."""
    cluster = _start_cluster()
    try:
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.stop("immediate")
        shutil.rmtree(cluster.datadir.parent, ignore_errors=True)


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """The URL of a fresh, empty database (postgresql://user:pass@127.0.0.1:port/db)."""
    pg_cluster.ensure_running()
    return pg_cluster.new_database()
