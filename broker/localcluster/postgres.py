"""A throwaway PostgreSQL server: initdb + pg_ctl in a directory of its own, on 127.0.0.1.

Used by `floe local-cluster` (the metadata database and Iceberg catalog of a local cluster) and
by the tests (tests/pg.py). Binaries are looked up in $FLOE_PG_BINDIR, on PATH, then in
Debian's /usr/lib/postgresql/<version>/bin. initdb refuses to run as root, so as root the
server belongs to (and runs as) the `postgres` system user; its directory must then be one that
user can reach (a fresh directory under the system temp dir, see `throwaway_server`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

STATEMENT_TIMEOUT_S = 120.0  # initdb, pg_ctl start/stop (which waits at most 60 s itself)


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why."""


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None."""
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
    """A port nobody listens on right now on 127.0.0.1 (another process may take it later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_user() -> str | None:
    """The system user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root and there is no 'postgres' user to run PostgreSQL as"
        ) from None
    return "postgres"


@dataclass
class PgServer:
    bindir: Path
    datadir: Path  # the cluster; its parent holds the server log, socket and password file
    port: int
    run_as: str | None  # a system user to run the server binaries as (when we are root)
    user: str = "floe"
    password: str = "floe"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _cmd(self, *args: str) -> list[str]:
        if self.run_as is None:
            return list(args)
        if shutil.which("runuser"):
            return ["runuser", "-u", self.run_as, "--", *args]
        return ["su", self.run_as, "-s", "/bin/sh", "-c", shlex.join(args)]

    def _run(self, *args: str) -> None:
        # cwd: the postgres user may not be allowed into ours
        out = subprocess.run(self._cmd(*args), capture_output=True, text=True, cwd="/",
                             timeout=STATEMENT_TIMEOUT_S)
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
        pwfile.write_text(self.password + "\n")
        self._chown(pwfile)
        self._run(str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", self.user,
                  f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.datadir.parent}'",
            "fsync": "off",  # a throwaway cluster: the server process is never crashed
            "full_page_writes": "off",
            "max_connections": "100",
            # dynamic shared memory as files in the data directory, not /dev/shm entries that
            # outlive or escape the server (a clean-clone CI run lost the test cluster's
            # segment to something: "could not open shared memory segment
            # /PostgreSQL.<n>: No such file or directory" on every new connection)
            "dynamic_shared_memory_type": "mmap",
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
        """Start the server again if it was stopped (e.g. by a test that failed midway)."""
        if not self.running():
            self.start()

    def pid(self) -> int | None:
        """The postmaster's process id while it runs (first line of postmaster.pid)."""
        try:
            return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def _chown(self, path: Path) -> None:
        if self.run_as is not None:
            pw = pwd.getpwnam(self.run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def admin(self, sql: str) -> None:
        """Run one statement as the superuser (autocommit: CREATE DATABASE needs that)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.encode())

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (an identifier); returns its URL."""
        if not name.isidentifier():
            raise ValueError(f"not a plain database name: {name!r}")
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)


def throwaway_server(user: str = "floe", password: str = "floe") -> PgServer:
    """initdb and start a server in a new directory under the system temp dir, on a free port.
    Raises PostgresUnavailable when the binaries (or, as root, a `postgres` user) are missing.
    Stop it with `PgServer.stop` and delete `datadir.parent` when done (`discard`)."""
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl, postgres) not "
                                  "found (set FLOE_PG_BINDIR, or install Debian's postgresql)")
    run_as = server_user()
    top = Path(tempfile.mkdtemp(prefix="floe-pg-"))
    server = PgServer(bindir, top / "data", free_port(), run_as, user, password)
    try:
        server._chown(top)
        server.init()
        server.start()
    except BaseException:
        shutil.rmtree(top, ignore_errors=True)
        raise
    return server


def discard(server: PgServer, mode: str = "fast") -> None:
    """Stop the server and delete its files. If pg_ctl cannot stop it (in `mode`, then
    immediately), the postmaster is killed: nothing is left running."""
    pid = server.pid()
    for how in (mode, "immediate"):
        try:
            if not server.running():
                break
            server.stop(how)
            break
        except (OSError, RuntimeError, subprocess.SubprocessError):
            continue
    if pid is not None and server.pid() == pid:  # still there after both attempts
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(server.datadir.parent, ignore_errors=True)
