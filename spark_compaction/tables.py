"""Looking at the catalog's tables through Spark: properties, the stats the compaction policy
decides on (spark_compaction.policy), and which tables are table topics (tabletopic.contract)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_compaction.errors import error_text
from spark_compaction.names import TableRef, quote, split_identifier, table_ref
from spark_compaction.policy import TableStats, Thresholds
from tabletopic.contract import is_table_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _one(spark: SparkSession, query: str) -> dict[str, Any]:
    rows = spark.sql(query).collect()
    return rows[0].asDict() if rows else {}


def table_properties(
    spark: SparkSession, table: str | TableRef, catalog: str = "floe"
) -> dict[str, str]:
    ref = table_ref(table, catalog)
    rows = spark.sql(f"SHOW TBLPROPERTIES {ref.sql}").collect()
    return {str(r["key"]): str(r["value"]) for r in rows}


def data_file_stats(
    spark: SparkSession, ref: TableRef, small_file_bytes: int = 0
) -> dict[str, int]:
    row = _one(
        spark,
        f"SELECT count(*) AS n, coalesce(sum(file_size_in_bytes), 0) AS bytes, "
        f"count_if(file_size_in_bytes < {int(small_file_bytes)}) AS small "
        f"FROM {ref.metadata('files')} WHERE content = 0",
    )
    deletes = _one(spark, f"SELECT count(*) AS n FROM {ref.metadata('files')} WHERE content > 0")
    return {
        "files": int(row["n"]),
        "bytes": int(row["bytes"]),
        "small": int(row["small"]),
        "delete_files": int(deletes["n"]),
    }


def snapshot_stats(spark: SparkSession, ref: TableRef) -> dict[str, Any]:
    row = _one(
        spark,
        "SELECT count(*) AS n, CAST(unix_millis(min(committed_at)) AS BIGINT) AS oldest "
        f"FROM {ref.metadata('snapshots')}",
    )
    return {"snapshots": int(row["n"]), "oldest_ms": row["oldest"]}


def manifest_count(spark: SparkSession, ref: TableRef) -> int:
    return int(_one(spark, f"SELECT count(*) AS n FROM {ref.metadata('manifests')}")["n"])


def table_stats(
    spark: SparkSession,
    table: str | TableRef,
    catalog: str = "floe",
    small_file_bytes: int = Thresholds.small_file_bytes,
) -> TableStats:
    ref = table_ref(table, catalog)
    files = data_file_stats(spark, ref, small_file_bytes)
    snaps = snapshot_stats(spark, ref)
    return TableStats(
        table=str(ref),
        data_files=files["files"],
        data_bytes=files["bytes"],
        small_data_files=files["small"],
        delete_files=files["delete_files"],
        manifests=manifest_count(spark, ref),
        snapshots=snaps["snapshots"],
        oldest_snapshot_ms=None if snaps["oldest_ms"] is None else int(snaps["oldest_ms"]),
    )


def list_namespaces(spark: SparkSession, catalog: str = "floe") -> list[tuple[str, ...]]:
    """Every namespace of the catalog, nested ones included."""
    out: list[tuple[str, ...]] = []
    todo: list[tuple[str, ...]] = [()]
    while todo:
        parent = todo.pop()
        where = ".".join(quote(p) for p in (catalog, *parent))
        for row in spark.sql(f"SHOW NAMESPACES IN {where}").collect():
            ns = tuple(split_identifier(str(row[0])))
            if ns and ns not in out:
                out.append(ns)
                todo.append(ns)
    return sorted(out)


def list_tables(
    spark: SparkSession,
    catalog: str = "floe",
    table_topics_only: bool = True,
    namespaces: Sequence[Sequence[str]] | None = None,
) -> list[TableRef]:
    """The catalog's tables (only table topics, tabletopic.contract, unless
    `table_topics_only` is false; only in `namespaces`, if given)."""
    refs: list[TableRef] = []
    wanted = None if namespaces is None else {tuple(n) for n in namespaces}
    for ns in list_namespaces(spark, catalog):
        if wanted is not None and ns not in wanted:
            continue
        where = ".".join(quote(p) for p in (catalog, *ns))
        for row in spark.sql(f"SHOW TABLES IN {where}").collect():
            if row["isTemporary"]:
                continue
            ref = TableRef(ns, str(row["tableName"]), catalog)
            if table_topics_only:
                try:
                    if not is_table_topic(table_properties(spark, ref)):
                        continue
                except Exception as e:  # dropped meanwhile, unreadable metadata, ...
                    log.warning("table %s: cannot read its properties: %s", ref, error_text(e))
                    continue
            refs.append(ref)
    return refs
