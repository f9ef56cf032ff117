"""Brokers of a cluster open the same fresh SQL catalog at once (floe local-cluster, compose).

What must hold: every opener gets a working catalog; none dies because another one created
pyiceberg's catalog tables first (seen with three brokers starting on one PostgreSQL)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from tabletopic.catalog import open_catalog

OPENERS = 6


def _open_together(url: str, warehouse: str) -> list[Catalog | BaseException]:
    start = threading.Barrier(OPENERS)
    results: list[Catalog | BaseException] = []
    lock = threading.Lock()

    def opener() -> None:
        start.wait(timeout=30)
        try:
            cat: Catalog | BaseException = open_catalog(url, warehouse)
        except BaseException as e:  # reported by the test
            cat = e
        with lock:
            results.append(cat)

    threads = [threading.Thread(target=opener) for _ in range(OPENERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "an opener hung"
    return results


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_first_opens_all_succeed(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'catalog.db'}"
    else:
        url = request.getfixturevalue("pg_cluster").new_database()
    results = _open_together(url, (tmp_path / "wh").as_uri())
    try:
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        assert len(results) == OPENERS
        # every catalog works, and sees what another one made
        first = results[0]
        assert isinstance(first, Catalog)
        first.create_namespace("ns")
        for cat in results[1:]:
            assert isinstance(cat, Catalog)
            assert ("ns",) in cat.list_namespaces()
    finally:
        for cat in results:  # close their connection pools (a broker keeps its one open)
            if isinstance(cat, SqlCatalog):
                cat.engine.dispose()
