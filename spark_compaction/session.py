"""A SparkSession that sees the broker's Iceberg catalog: the catalog's properties come from
spark_compaction.catalog (which catalogs, and how they are shared with pyiceberg), the jars from
spark_compaction.jars (where they come from, what is relocated).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

# catalog_properties and s3_properties are imported from here by tests/unit
from spark_compaction.catalog import (
    S3_SDK_CLASS,
    catalog_kind,
    catalog_properties,
    prepare_sqlite_catalog,
    resolve_catalog,
    s3_properties,
    sqlite_catalog_path,
)
from spark_compaction.jars import SparkSetupError, cache_dir, jar_has, required_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SparkSetupError", "catalog_properties", "s3_properties", "session", "spark_conf"]

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
QUIET_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.jdbc.name = org.apache.iceberg.jdbc
logger.jdbc.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.sparkenv.name = org.apache.spark.SparkEnv
logger.sparkenv.level = error
logger.metrics.name = org.apache.spark.metrics
logger.metrics.level = error
logger.stringutils.name = org.apache.spark.sql.catalyst.util.SparkStringUtils
logger.stringutils.level = error
logger.hadoopfs.name = org.apache.hadoop.fs
logger.hadoopfs.level = error
"""


def _log_config() -> Path:
    digest = hashlib.sha256(QUIET_LOG4J2.encode()).hexdigest()[:12]
    path = cache_dir() / f"log4j2-{digest}.properties"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(QUIET_LOG4J2)
        os.replace(tmp, path)
    return path


def spark_conf(
    catalog_url: str,
    warehouse_url: str,
    name: str = "floe",
    master: str = "local[2]",
    jars: Sequence[str | Path] = (),
    packages: Sequence[str] = (),
    conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every Spark setting of a session (jars given, not looked up)."""
    prefix = f"spark.sql.catalog.{name}"
    out: dict[str, str] = {
        "spark.master": master,
        "spark.app.name": "floe",
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.defaultCatalog": name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
    }
    for k, v in catalog_properties(catalog_url, warehouse_url).items():
        out[f"{prefix}.{k}"] = v
    if master.startswith("local"):
        out["spark.driver.host"] = "127.0.0.1"
        out["spark.driver.bindAddress"] = "127.0.0.1"
    if jars:
        out["spark.jars"] = ",".join(str(j) for j in jars)
    if packages:
        out["spark.jars.packages"] = ",".join(packages)
        out["spark.jars.ivy"] = str(cache_dir() / "ivy")
    for k, v in (conf or {}).items():
        if k in ("spark.jars", "spark.jars.packages") and k in out:
            out[k] = f"{out[k]},{v}"
        else:
            out[k] = v
    return out


def session(
    catalog_url: str | None = None,
    warehouse_url: str | None = None,
    data_dir: str | Path | None = None,
    name: str = "floe",
    master: str = "local[2]",
    extra_jars: Sequence[str | Path] = (),
    packages: Sequence[str] = (),
    conf: Mapping[str, str] | None = None,
    quick_start: bool = False,
) -> SparkSession:
    """A SparkSession with Iceberg and the broker's catalog as `name` (the default catalog).

    Without URLs the catalog is the broker's default for `data_dir` (sqlite:///<data-dir>/
    catalog.db, file://<data-dir>/warehouse; data_dir defaulting to ./floe-data like the
    broker). A JDBC catalog's `name` is also its key in the catalog database: keep "floe".
    If this process already runs a SparkSession it is reused when it has the same catalog.
    `quick_start`: JIT-compile with C1 only: short sessions (SQL, tests) start and answer
    about twice as fast; long heavy jobs run slower.
    """
    from pyspark.sql import SparkSession

    catalog_url, warehouse_url = resolve_catalog(catalog_url, warehouse_url, data_dir)
    if catalog_kind(catalog_url) == "sqlite":
        prepare_sqlite_catalog(sqlite_catalog_path(catalog_url))
    jars = [*required_jars(catalog_url), *extra_jars]
    s3 = s3_properties(warehouse_url, os.environ)
    if s3 and not packages and not any(jar_has(Path(j), S3_SDK_CLASS) for j in jars):
        raise SparkSetupError(
            f"the warehouse {warehouse_url} is on S3: Iceberg's S3FileIO needs the AWS SDK v2 "
            "from the iceberg-aws-bundle jar (Maven Central: org.apache.iceberg:"
            "iceberg-aws-bundle, same version as the runtime); pass it with extra_jars / "
            "--jars, or packages / --packages"
        )
    user_conf = dict(conf or {})
    for k, v in s3.items():
        user_conf.setdefault(f"spark.sql.catalog.{name}.{k}", v)
    settings = spark_conf(catalog_url, warehouse_url, name, master, jars, packages, user_conf)
    java_opts = f"-Dlog4j2.configurationFile={_log_config().as_uri()}"
    if quick_start:
        java_opts += " -XX:TieredStopAtLevel=1"
    given = settings.get("spark.driver.extraJavaOptions")
    settings["spark.driver.extraJavaOptions"] = f"{java_opts} {given}" if given else java_opts

    active = SparkSession.getActiveSession()
    if active is not None:
        key = f"spark.sql.catalog.{name}.uri"
        have = active.conf.get(key, None)
        if have != settings[key]:
            raise SparkSetupError(
                f"a SparkSession already runs in this process with {key}={have!r}, "
                f"not {settings[key]!r}: stop it first"
            )
        return active
    builder = SparkSession.builder
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
