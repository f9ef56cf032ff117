"""The Iceberg catalog the broker writes to, chosen by URL.

sqlite:///PATH            pyiceberg's SQL catalog (Iceberg's Java JdbcCatalog reads it too)
postgresql://USER@HOST/DB the same catalog in PostgreSQL
rest+http(s)://HOST/PATH  an Iceberg REST catalog
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog


def open_catalog(url: str, warehouse: str, name: str = "floe") -> Catalog:
    if url.startswith("sqlite:///"):
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(name, uri=url, warehouse=warehouse)
    if url.startswith(("postgresql://", "postgres://")):
        from pyiceberg.catalog.sql import SqlCatalog

        uri = "postgresql+psycopg://" + url.split("://", 1)[1]
        return SqlCatalog(name, uri=uri, warehouse=warehouse)
    if url.startswith(("rest+http://", "rest+https://")):
        from pyiceberg.catalog.rest import RestCatalog

        props: dict[str, Any] = {"uri": url[len("rest+") :], "warehouse": warehouse}
        return RestCatalog(name, **props)
    raise ValueError(
        f"unsupported catalog URL {url!r} (sqlite:///…, postgresql://…, rest+http://…)"
    )
