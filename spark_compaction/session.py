"""A SparkSession that sees the broker's Iceberg catalog.

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

Jars come from places this machine can reach (no Maven at run time):
  - the Iceberg Spark runtime: the PyPI package `snowpark-connect-deps-iceberg`;
  - the Jackson classes that runtime jar lacks (it expects them relocated under
    `org.apache.iceberg.shaded.`): pyspark's own Jackson jars, relocated once with jarjar
    (Debian `libjarjar-java`) and cached;
  - JDBC drivers: Debian `libxerial-sqlite-jdbc-java`, `libpostgresql-jdbc-java`;
  - for REST catalogs, Apache HttpClient 5.4+, which that runtime jar also lacks, relocated
    the same way. Nothing reachable here has it (Debian bookworm's libhttpclient5-java is
    5.2): REST needs FLOE_HTTPCLIENT5_JARS, or the official runtime jar (which has Jackson and
    HttpClient inside) as FLOE_ICEBERG_RUNTIME_JAR.
Each can be pointed elsewhere with an environment variable (FLOE_ICEBERG_RUNTIME_JAR,
FLOE_JARJAR_JAR, FLOE_SQLITE_JDBC_JAR, FLOE_POSTGRESQL_JDBC_JAR, FLOE_HTTPCLIENT5_JARS); the
cache lives in $FLOE_CACHE_DIR (default $XDG_CACHE_HOME/floe or ~/.cache/floe).

A warehouse on S3 (s3://) is read and written with Iceberg's S3FileIO, which needs the AWS SDK
of the iceberg-aws-bundle jar: no registry reachable here has it, so it must be given
(extra_jars / --jars, or packages / --packages from Maven). The warehouse URL is the broker's
(`s3://BUCKET/PREFIX?endpoint=&region=&path_style=`): its location goes to the catalog, its
parameters to S3FileIO (s3_properties). Only that configuration is tested here, not S3 itself.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

from tabletopic.warehouse import parse_warehouse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12-*.jar"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SHADED = "org.apache.iceberg.shaded"
JACKSON_RULES = f"rule com.fasterxml.jackson.** {SHADED}.com.fasterxml.jackson.@1\n"
HTTPCLIENT_RULES = f"rule org.apache.hc.** {SHADED}.org.apache.hc.@1\n"
JACKSON_PROBE = "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactoryBuilder.class"
HTTPCLIENT_PROBE = (
    "org/apache/iceberg/shaded/org/apache/hc/client5/http/ssl/TlsSocketStrategy.class"
)
HTTPCLIENT_NEEDED = "org/apache/hc/client5/http/ssl/TlsSocketStrategy.class"  # 5.4 and later
_BUILD_VERSION = "1"  # bump to rebuild every cached jar

DEBIAN_JARS = {  # what -> (Debian package, candidate paths, env override)
    "jarjar": ("libjarjar-java", ["/usr/share/java/jarjar.jar"], "FLOE_JARJAR_JAR"),
    "sqlite": (
        "libxerial-sqlite-jdbc-java",
        ["/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/xerial-sqlite-jdbc.jar"],
        "FLOE_SQLITE_JDBC_JAR",
    ),
    "postgresql": (
        "libpostgresql-jdbc-java",
        ["/usr/share/java/postgresql.jar"],
        "FLOE_POSTGRESQL_JDBC_JAR",
    ),
}

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


class SparkSetupError(RuntimeError):
    """Something Spark needs is missing; the message says what to install."""


# --------------------------------------------------------------------------------------------
# The catalog: URLs -> Spark catalog properties
# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# Jars
# --------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    if os.environ.get("FLOE_CACHE_DIR"):
        return Path(os.environ["FLOE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "floe"


def iceberg_runtime_jar() -> Path:
    """$FLOE_ICEBERG_RUNTIME_JAR (e.g. the official jar from Maven Central), else the one in
    the PyPI package snowpark-connect-deps-iceberg."""
    if os.environ.get("FLOE_ICEBERG_RUNTIME_JAR"):
        p = Path(os.environ["FLOE_ICEBERG_RUNTIME_JAR"])
        if not p.is_file():
            raise SparkSetupError(f"FLOE_ICEBERG_RUNTIME_JAR={p}: no such file")
        return p
    spec = importlib.util.find_spec("snowpark_connect_deps_iceberg")
    if spec is None or spec.origin is None:
        raise SparkSetupError(
            "the Iceberg Spark runtime jar is missing: pip install snowpark-connect-deps-iceberg "
            "(or set FLOE_ICEBERG_RUNTIME_JAR)"
        )
    jars_dir = Path(spec.origin).parent / "jars"
    found = sorted(jars_dir.glob(ICEBERG_RUNTIME))
    if not found:
        raise SparkSetupError(f"no {ICEBERG_RUNTIME} in {jars_dir}")
    return found[-1]


@functools.cache
def _jar_entries(path: Path, mtime: float) -> frozenset[str]:
    with zipfile.ZipFile(path) as z:
        return frozenset(z.namelist())


def jar_has(path: Path, entry: str) -> bool:
    return entry in _jar_entries(path.resolve(), path.stat().st_mtime)


def pyspark_jars_dir() -> Path:
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("pyspark is missing: pip install 'pyspark==3.5.*'") from None
    return Path(pyspark.__file__).parent / "jars"


def debian_jar(what: str) -> Path:
    """A jar Debian installs (or the file named by its FLOE_* environment variable)."""
    package, candidates, env = DEBIAN_JARS[what]
    if os.environ.get(env):
        p = Path(os.environ[env])
        if not p.is_file():
            raise SparkSetupError(f"{env}={p}: no such file")
        return p
    for c in candidates:
        if Path(c).is_file():
            return Path(c)
    raise SparkSetupError(
        f"{what} jar not found ({', '.join(candidates)}): install the Debian package {package} "
        f"(apt-get install {package}) or set {env} to the jar"
    )


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if not found:
        raise SparkSetupError("java not found: install a JDK 17 (apt-get install openjdk-17-jdk)")
    return found


def _merge_jars(sources: Iterable[Path], out: Path) -> None:
    """One jar with every class of `sources`: no multi-release, signature, module or service
    files (they would name classes by their unrelocated names)."""
    seen: set[str] = set()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for src in sources:
            with zipfile.ZipFile(src) as z:
                for info in z.infolist():
                    n = info.filename
                    upper = n.upper()
                    if (
                        n in seen
                        or n.endswith("/")
                        or n.startswith(("META-INF/versions/", "META-INF/services/"))
                        or n.endswith("module-info.class")
                        or (
                            upper.startswith("META-INF/")
                            and upper.endswith((".SF", ".RSA", ".DSA", ".EC", "MANIFEST.MF"))
                        )
                    ):
                        continue
                    seen.add(n)
                    dst.writestr(n, z.read(n))


def relocated_jar(name: str, sources: Sequence[Path], rules: str) -> Path:
    """`sources` merged and relocated by jarjar `rules`, built once into the cache."""
    jarjar = debian_jar("jarjar")
    key = hashlib.sha256(_BUILD_VERSION.encode() + rules.encode())
    for s in [jarjar, *sources]:
        st = s.stat()
        key.update(f"{s.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
    target = cache_dir() / "jars" / f"{name}-{key.hexdigest()[:16]}.jar"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        merged, rules_file, out = Path(tmp, "in.jar"), Path(tmp, "rules.txt"), Path(tmp, "out.jar")
        _merge_jars(sources, merged)
        rules_file.write_text(rules)
        cmd = [java_binary(), "-cp", str(jarjar), "com.tonicsystems.jarjar.Main"]
        r = subprocess.run(
            [*cmd, "process", str(rules_file), str(merged), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0 or not out.is_file():
            raise SparkSetupError(f"jarjar failed building {name}: {r.stderr.strip()[-2000:]}")
        os.replace(out, target)  # atomic: concurrent builders both end with a whole jar
    return target


def jackson_jar() -> Path:
    """pyspark's Jackson relocated where the Iceberg runtime jar looks for it."""
    jars = pyspark_jars_dir()
    sources = []
    for part in ("core", "databind", "annotations"):
        found = sorted(jars.glob(f"jackson-{part}-[0-9]*.jar"))
        if not found:
            raise SparkSetupError(f"no jackson-{part} jar in {jars}")
        sources.append(found[-1])
    return relocated_jar("iceberg-jackson", sources, JACKSON_RULES)


def httpclient_jar() -> Path:
    """Apache HttpClient 5.4+ relocated for Iceberg's REST client: the jars named by
    $FLOE_HTTPCLIENT5_JARS (httpclient5, httpcore5, httpcore5-h2; os.pathsep-separated), else
    Debian's libhttpclient5-java if it is recent enough (bookworm's 5.2 is not)."""
    env = os.environ.get("FLOE_HTTPCLIENT5_JARS")
    if env:
        sources = [Path(p) for p in env.split(os.pathsep) if p]
    else:
        sources = [
            Path(p)
            for pattern in ("httpclient5.jar", "httpcore5.jar", "httpcore5-h2.jar")
            for p in sorted(glob.glob(f"/usr/share/java/{pattern}"))
        ]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise SparkSetupError(f"FLOE_HTTPCLIENT5_JARS: no such file(s): {', '.join(missing)}")
    if not any(jar_has(p, HTTPCLIENT_NEEDED) for p in sources):
        found = ", ".join(str(p) for p in sources) or "none"
        raise SparkSetupError(
            "a REST catalog needs Apache HttpClient 5.4 or later, which the Iceberg runtime jar "
            f"of snowpark-connect-deps-iceberg leaves out (jars found: {found}; Debian "
            "bookworm's libhttpclient5-java is 5.2). Set FLOE_ICEBERG_RUNTIME_JAR to the "
            "official iceberg-spark-runtime-3.5_2.12 jar (Maven Central), or "
            "FLOE_HTTPCLIENT5_JARS to httpclient5, httpcore5 and httpcore5-h2 5.4+ jars"
        )
    return relocated_jar("iceberg-httpclient5", sources, HTTPCLIENT_RULES)


def required_jars(catalog_url: str) -> list[Path]:
    """Every jar a session on this catalog needs, prepared (built) if need be. Only what the
    runtime jar lacks is added (the official runtime jar has Jackson and HttpClient inside)."""
    runtime = iceberg_runtime_jar()
    jars = [runtime]
    if not jar_has(runtime, JACKSON_PROBE):
        jars.append(jackson_jar())
    kind = catalog_kind(catalog_url)
    if kind in ("sqlite", "postgresql"):
        jars.append(debian_jar(kind))
    elif not jar_has(runtime, HTTPCLIENT_PROBE):
        jars.append(httpclient_jar())
    return jars


def _log_config() -> Path:
    digest = hashlib.sha256(QUIET_LOG4J2.encode()).hexdigest()[:12]
    path = cache_dir() / f"log4j2-{digest}.properties"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(QUIET_LOG4J2)
        os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------------------------
# The session
# --------------------------------------------------------------------------------------------
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
