"""The broker's Iceberg catalog as a Spark catalog: catalog URLs -> Spark catalog properties.

The catalog is the one the broker writes with pyiceberg, chosen by the same URLs
(`broker.config`: `catalog`, `warehouse`, defaults from `data.dir`):

    sqlite:///PATH             Iceberg's JdbcCatalog on the same SQLite file
    postgresql://U:P@HOST/DB   Iceberg's JdbcCatalog on the same PostgreSQL database
    rest+http(s)://HOST/PATH   Iceberg's RESTCatalog

pyiceberg's SqlCatalog and Iceberg's Java JdbcCatalog share one schema: the tables
`iceberg_tables` and `iceberg_namespace_properties`, keyed by `catalog_name`. The Java side
takes its `catalog_name` from the Spark catalog's name, so the Spark catalog must be called
like the broker's catalog ("floe"). `jdbc.schema-version=V1` is the schema pyiceberg (0.12)
creates as well (`iceberg_tables.iceberg_type`; a NULL type is a table for both), and both
commit with the same compare-and-swap on `metadata_location`. On SQLite the Java side does not
create the tables itself (`jdbc.init-catalog-tables=false`, see catalog_properties): its check
leaves a cursor open, which would keep the file read-locked, and the broker unable to commit,
for as long as the session lives. They are created beforehand instead (prepare_sqlite_catalog).

A warehouse on S3 (s3://) is read and written with Iceberg's S3FileIO, which needs the AWS SDK
of the iceberg-aws-bundle jar: no registry reachable here has it, so it must be given
(extra_jars / --jars, or packages / --packages from Maven). The warehouse URL is the broker's
(`s3://BUCKET/PREFIX?endpoint=&region=&path_style=`): its location goes to the catalog, its
parameters to S3FileIO (s3_properties). Only that configuration is tested here, not S3 itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from tabletopic.warehouse import parse_warehouse


def resolve_catalog(
    catalog_url: str | None, warehouse_url: str | None, data_dir: str | Path | None
) -> tuple[str, str]:
    """The catalog and warehouse URLs the broker would use for these settings."""
    from broker.config import load_settings

    flags: dict[str, str | None] = {
        "data.dir": None if data_dir is None else str(data_dir),
        "catalog": catalog_url,
        "warehouse": warehouse_url,
    }
    settings = load_settings(flags, environ={})
    return settings.catalog_url, settings.warehouse_url


def catalog_properties(catalog_url: str, warehouse_url: str) -> dict[str, str]:
    """Iceberg catalog properties (without the `spark.sql.catalog.NAME.` prefix)."""
    location = parse_warehouse(warehouse_url, {}).location if warehouse_url else ""
    props = {"warehouse": location, "cache-enabled": "false"}
    if catalog_url.startswith("sqlite:///"):
        path = catalog_url[len("sqlite:///") :].split("?", 1)[0]
        if not path or path == ":memory:":
            raise ValueError(f"{catalog_url!r}: Spark needs the catalog in a file")
        return {
            **props,
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": f"jdbc:sqlite:{Path(unquote(path)).resolve()}",
            "jdbc.schema-version": "V1",
            # JdbcCatalog's table check leaves a metadata cursor open: on SQLite that is a read
            # lock held for the session's life, and every writer (the broker) gets "database
            # is locked". The tables are created beforehand instead (prepare_sqlite_catalog).
            "jdbc.init-catalog-tables": "false",
            "jdbc.busy_timeout": "10000",
        }
    scheme = catalog_url.split("://", 1)[0]
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        u = urlsplit(catalog_url)
        netloc = u.hostname or "localhost"
        if ":" in netloc:  # IPv6 literal
            netloc = f"[{netloc}]"
        if u.port:
            netloc += f":{u.port}"
        out = {
            **props,
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": urlunsplit(("jdbc:postgresql", netloc, u.path, u.query, "")),
            "jdbc.schema-version": "V1",
        }
        if u.username:
            out["jdbc.user"] = unquote(u.username)
        if u.password:
            out["jdbc.password"] = unquote(u.password)
        return out
    if scheme in ("rest+http", "rest+https"):
        return {**props, "type": "rest", "uri": catalog_url[len("rest+") :]}
    raise ValueError(
        f"unsupported catalog URL {catalog_url!r} (sqlite:///…, postgresql://…, rest+http://…)"
    )


SQLITE_CATALOG_DDL = (  # pyiceberg SqlCatalog's tables, with Iceberg's V1 column iceberg_type
    """CREATE TABLE IF NOT EXISTS iceberg_tables (
        catalog_name VARCHAR(255) NOT NULL,
        table_namespace VARCHAR(255) NOT NULL,
        table_name VARCHAR(255) NOT NULL,
        metadata_location VARCHAR(1000),
        previous_metadata_location VARCHAR(1000),
        iceberg_type VARCHAR(5),
        PRIMARY KEY (catalog_name, table_namespace, table_name))""",
    """CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
        catalog_name VARCHAR(255) NOT NULL,
        namespace VARCHAR(255) NOT NULL,
        property_key VARCHAR(255) NOT NULL,
        property_value VARCHAR(1000) NOT NULL,
        PRIMARY KEY (catalog_name, namespace, property_key))""",
)


def sqlite_catalog_path(catalog_url: str) -> Path:
    return Path(catalog_properties(catalog_url, "")["uri"][len("jdbc:sqlite:") :])


def prepare_sqlite_catalog(path: Path) -> None:
    """Create the catalog tables if missing (what pyiceberg would create), so that Spark's
    JdbcCatalog can run without its own table check (see catalog_properties)."""
    import sqlite3

    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=30)
    try:
        with con:
            for ddl in SQLITE_CATALOG_DDL:
                con.execute(ddl)
    finally:
        con.close()


S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
S3_SDK_CLASS = "software/amazon/awssdk/services/s3/S3Client.class"  # in iceberg-aws-bundle


def s3_properties(warehouse_url: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Catalog properties for a warehouse on S3 (Iceberg's S3FileIO, which needs the AWS SDK
    of the iceberg-aws-bundle jar). Endpoint, region and path style come from the warehouse
    URL's `?endpoint=&region=&path_style=`, as for the broker (tabletopic.warehouse); without
    an endpoint there, from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (path style then), and
    without a region, from AWS_REGION / AWS_DEFAULT_REGION."""
    if not warehouse_url.startswith(("s3://", "s3a://")):
        return {}
    props = {"io-impl": S3_FILE_IO, **parse_warehouse(warehouse_url, environ).java_properties()}
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint and "s3.endpoint" not in props:
        props["s3.endpoint"] = endpoint
        props["s3.path-style-access"] = "true"
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region and "client.region" not in props:
        props["client.region"] = region
    return props


def catalog_kind(catalog_url: str) -> str:
    """sqlite | postgresql | rest"""
    props = catalog_properties(catalog_url, "")
    if props.get("type") == "rest":
        return "rest"
    return "sqlite" if props["uri"].startswith("jdbc:sqlite:") else "postgresql"
