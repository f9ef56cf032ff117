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

from tabletopic.warehouse import parse_warehouse


def catalog_properties(warehouse_url: str) -> dict[str, str]:
    """pyiceberg catalog properties for the warehouse (`warehouse` plus FileIO properties)."""
    wh = parse_warehouse(warehouse_url)
    return {"warehouse": wh.location, **wh.fileio_properties()}


def open_catalog(url: str, warehouse: str, name: str = "floe") -> Catalog:
    props: dict[str, Any] = catalog_properties(warehouse)
    if url.startswith("sqlite:///"):
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(name, uri=url, **props)
    if url.startswith(("postgresql://", "postgres://")):
        from pyiceberg.catalog.sql import SqlCatalog

        uri = "postgresql+psycopg://" + url.split("://", 1)[1]
        return SqlCatalog(name, uri=uri, **props)
    if url.startswith(("rest+http://", "rest+https://")):
        raise ValueError(
            f"catalog {url!r}: Iceberg REST catalogs are not supported yet (floe's commit "
            "protocol is tested only against the SQL catalog); use sqlite:///… or postgresql://…"
        )
    raise ValueError(f"unsupported catalog URL {url!r} (sqlite:///…, postgresql://…)")
