"""A throwaway PostgreSQL cluster for tests (the server itself: broker.localcluster.postgres).

`pg_cluster` (session) starts it once; `pg_url` (per test) hands out a fresh database in it.
When the server binaries are missing the tests that need them are skipped, unless the CI
environment variable is set: then a missing PostgreSQL fails the run instead of silently
testing less. See broker.localcluster.postgres for where the binaries are looked up and how a
root user runs them."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.localcluster.postgres import (
    PgServer,
    PostgresUnavailable,
    find_bindir,
    free_port,
    server_user,
)

USER = "floe"
PASSWORD = "floe-test-secret"
_db_numbers = itertools.count(1)

__all__ = ["PgCluster", "find_bindir", "free_port", "in_ci", "pg_cluster", "pg_url"]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


class PgCluster(PgServer):
    """The product's throwaway server (broker.localcluster.postgres), plus fresh databases."""

    def new_database(self) -> str:
        return self.create_database(f"floe_test_{next(_db_numbers)}")


def _start_cluster() -> PgCluster:
    bindir = find_bindir()
    why = "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found"
    run_as = None
    try:
        run_as = server_user()
    except PostgresUnavailable as e:  # root, and nobody else to run initdb as
        bindir, why = None, str(e)
    if bindir is None:
        if in_ci():
            pytest.fail(f"{why}; CI is set, so this fails instead of skipping", pytrace=False)
        pytest.skip(why)
    top = Path(tempfile.mkdtemp(prefix="floe-pg-"))
    cluster = PgCluster(bindir, top / "data", free_port(), run_as, USER, PASSWORD)
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


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh metadata database on each backend: an SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    return str(request.getfixturevalue("pg_url"))
