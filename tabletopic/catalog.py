"""The Iceberg catalog the broker writes to, chosen by URL.

sqlite:///PATH            pyiceberg's SQL catalog (Iceberg's Java JdbcCatalog reads it too)
postgresql://USER@HOST/DB the same catalog in PostgreSQL
rest+http(s)://…          refused for now: no REST catalog server can be run and tested here,
                          and an untested catalog is not offered (see README)

The warehouse URL (tabletopic.warehouse) gives the catalog its `warehouse` location and the
FileIO properties every table is opened with: DurableFileIO (local files fsynced before the
catalog commit) and, for S3, the endpoint, region and path style.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from s3stream.retry import RetryPolicy
from tabletopic.warehouse import parse_warehouse

# pyiceberg's SqlCatalog creates its tables (if absent: create_all checks first); brokers of a
# cluster starting together race there, and the losers get a duplicate-key/duplicate-table
# error. Creating again finds the tables the winner made. (PostgreSQL says duplicate key or
# table; SQLite says "table ... already exists", or "database is locked" while the winner
# writes.)


def _lost_create_race(e: BaseException) -> bool:
    if isinstance(e, IntegrityError | ProgrammingError):
        return True
    return isinstance(e, OperationalError) and any(
        s in str(e) for s in ("already exists", "database is locked"))


_CREATE_RACE = RetryPolicy(
    max_attempts=5, base_delay=0.1, max_delay=1.0, deadline=10.0, retriable=_lost_create_race)


def catalog_properties(warehouse_url: str) -> dict[str, str]:
    """pyiceberg catalog properties for the warehouse (`warehouse` plus FileIO properties)."""
    wh = parse_warehouse(warehouse_url)
    return {"warehouse": wh.location, **wh.fileio_properties()}


def open_catalog(url: str, warehouse: str, name: str = "floe") -> Catalog:
    props: dict[str, Any] = catalog_properties(warehouse)
    if url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        from pyiceberg.catalog.sql import SqlCatalog

        uri = url if url.startswith("sqlite:///") else (
            "postgresql+psycopg://" + url.split("://", 1)[1])
        # Tables are created here rather than by the constructor, so that an opener losing
        # the creation race keeps its catalog (and its connection pool) and just tries again.
        cat = SqlCatalog(name, uri=uri, init_catalog_tables="false", **props)
        _CREATE_RACE.run(cat.create_tables, f"creating the tables of catalog {url.split('@')[-1]}")
        return cat
    if url.startswith(("rest+http://", "rest+https://")):
        raise ValueError(
            f"catalog {url!r}: Iceberg REST catalogs are not supported yet (floe's commit "
            "protocol is tested only against the SQL catalog); use sqlite:///… or postgresql://…"
        )
    raise ValueError(f"unsupported catalog URL {url!r} (sqlite:///…, postgresql://…)")
