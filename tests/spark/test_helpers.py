"""spark_compaction's pure parts: catalog URLs -> Spark settings, names, jars, CLI parsing and
output (no Spark started)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import zipfile
from pathlib import Path

import pytest

from spark_compaction import catalog, jars
from spark_compaction import session as sess
from spark_compaction.arguments import add_parsers, duration, size
from spark_compaction.names import TableRef, split_identifier, sql_string, timestamp_literal
from spark_compaction.output import jsonable, render_table


def test_sqlite_catalog_is_the_broker_catalog_through_jdbc(tmp_path: Path) -> None:
    props = catalog.catalog_properties(f"sqlite:///{tmp_path}/catalog.db", "file:///w")
    assert props["catalog-impl"] == "org.apache.iceberg.jdbc.JdbcCatalog"
    assert props["uri"] == f"jdbc:sqlite:{tmp_path}/catalog.db"
    assert props["jdbc.schema-version"] == "V1"
    assert props["jdbc.init-catalog-tables"] == "false"  # see catalog_properties
    assert props["warehouse"] == "file:///w"
    assert props["cache-enabled"] == "false"  # see the broker's commits at once


def test_relative_sqlite_path_is_made_absolute(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    props = catalog.catalog_properties("sqlite:///data/catalog.db", "file:///w")
    assert props["uri"] == f"jdbc:sqlite:{tmp_path / 'data' / 'catalog.db'}"


def test_postgresql_catalog_url_becomes_jdbc_with_credentials() -> None:
    props = catalog.catalog_properties(
        "postgresql://floe:p%40ss@db.example:5433/lake?sslmode=require", "s3://b/w")
    assert props["uri"] == "jdbc:postgresql://db.example:5433/lake?sslmode=require"
    assert props["jdbc.user"] == "floe" and props["jdbc.password"] == "p@ss"
    assert "jdbc.init-catalog-tables" not in props
    assert catalog.catalog_kind("postgres://u@h/db") == "postgresql"


def test_rest_catalog_url() -> None:
    props = catalog.catalog_properties("rest+https://cat.example/api", "s3://b/w")
    assert props["type"] == "rest" and props["uri"] == "https://cat.example/api"
    assert catalog.catalog_kind("rest+http://h:8181") == "rest"


def test_unknown_catalog_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported catalog URL"):
        catalog.catalog_properties("mysql://h/db", "file:///w")


def test_defaults_follow_the_broker_settings(tmp_path: Path) -> None:
    cat, wh = catalog.resolve_catalog(None, None, tmp_path / "d")
    assert cat == f"sqlite:///{(tmp_path / 'd').resolve()}/catalog.db"
    assert wh == (tmp_path / "d" / "warehouse").resolve().as_uri()
    assert catalog.resolve_catalog("sqlite:////x.db", "file:///y", tmp_path) == (
        "sqlite:////x.db", "file:///y")


def test_spark_conf_names_the_catalog_and_keeps_spark_small() -> None:
    conf = sess.spark_conf("sqlite:////d/catalog.db", "file:///d/w", jars=["/a.jar", "/b.jar"],
                           conf={"spark.jars": "/c.jar", "spark.sql.shuffle.partitions": "8"})
    assert conf["spark.sql.catalog.floe"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.floe.uri"] == "jdbc:sqlite:/d/catalog.db"
    assert conf["spark.sql.defaultCatalog"] == "floe"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.jars"] == "/a.jar,/b.jar,/c.jar"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert "IcebergSparkSessionExtensions" in conf["spark.sql.extensions"]


def test_prepare_sqlite_catalog_creates_pyiceberg_compatible_tables(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "sub" / "catalog.db"
    catalog.prepare_sqlite_catalog(path)
    catalog.prepare_sqlite_catalog(path)  # idempotent
    con = sqlite3.connect(path)
    cols = [r[1] for r in con.execute("PRAGMA table_info(iceberg_tables)")]
    assert cols == ["catalog_name", "table_namespace", "table_name", "metadata_location",
                    "previous_metadata_location", "iceberg_type"]
    con.close()
    from pyiceberg.catalog.sql import SqlCatalog

    SqlCatalog("floe", uri=f"sqlite:///{path}", warehouse=tmp_path.as_uri()).create_namespace("n")


def test_missing_debian_jar_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOE_SQLITE_JDBC_JAR", raising=False)
    monkeypatch.setitem(jars.DEBIAN_JARS, "sqlite", ("libxerial-sqlite-jdbc-java",
                                                     ["/nonexistent/sqlite-jdbc.jar"],
                                                     "FLOE_SQLITE_JDBC_JAR"))
    with pytest.raises(jars.SparkSetupError, match="apt-get install libxerial-sqlite-jdbc-java"):
        jars.debian_jar("sqlite")
    monkeypatch.setenv("FLOE_SQLITE_JDBC_JAR", "/nonexistent/other.jar")
    with pytest.raises(jars.SparkSetupError, match="FLOE_SQLITE_JDBC_JAR"):
        jars.debian_jar("sqlite")


def test_rest_needs_a_recent_httpclient(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old = tmp_path / "httpclient5-5.2.jar"
    with zipfile.ZipFile(old, "w") as z:
        z.writestr("org/apache/hc/client5/http/impl/classic/HttpClients.class", b"")
    monkeypatch.setenv("FLOE_HTTPCLIENT5_JARS", str(old))
    with pytest.raises(jars.SparkSetupError, match=r"HttpClient 5\.4"):
        jars.httpclient_jar()


def test_relocated_jar_is_built_once_and_relocates(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    try:
        jars.debian_jar("jarjar")
        jars.java_binary()
    except jars.SparkSetupError as e:
        pytest.skip(str(e))
    monkeypatch.setenv("FLOE_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "in.jar"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        z.writestr("META-INF/versions/9/module-info.class", b"")
    jar = jars.jackson_jar()
    assert jar == jars.jackson_jar()  # cached
    with zipfile.ZipFile(jar) as z:
        names = z.namelist()
    assert "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactoryBuilder.class" in names
    assert not any(n.startswith("com/fasterxml/") for n in names)
    assert not any(n.startswith(("META-INF/versions/", "META-INF/services/")) for n in names)


def test_identifiers() -> None:
    assert split_identifier("a.b") == ["a", "b"]
    assert split_identifier("`my.ns`.`we``ird`") == ["my.ns", "we`ird"]
    for bad in ("a..b", "`a", ".a", "a."):
        with pytest.raises(ValueError):
            split_identifier(bad)
    ref = TableRef.parse("default.orders")
    assert ref == TableRef(("default",), "orders")
    assert TableRef.parse("floe.default.orders") == ref  # the catalog's own name is dropped
    assert TableRef.parse("a.b.c") == TableRef(("a", "b"), "c")
    with pytest.raises(ValueError):
        TableRef.parse("orders")
    odd = TableRef(("my-ns",), "it's")
    assert odd.sql == "`floe`.`my-ns`.`it's`"
    assert odd.arg == "'`my-ns`.`it\\'s`'"
    assert str(odd) == "`my-ns`.`it's`"
    assert TableRef.parse(str(odd)) == odd


def test_sql_literals() -> None:
    assert sql_string("a'b\\c") == "'a\\'b\\\\c'"
    assert timestamp_literal(0) == "TIMESTAMP '1970-01-01T00:00:00.000Z'"


def test_durations_and_sizes() -> None:
    assert duration("90") == dt.timedelta(seconds=90)
    assert duration("30m") == dt.timedelta(minutes=30)
    assert duration("1.5h") == dt.timedelta(minutes=90)
    assert duration("1d") == dt.timedelta(days=1)
    assert size("64m") == 64 << 20 and size("1g") == 1 << 30 and size("512kb") == 512 << 10
    with pytest.raises(argparse.ArgumentTypeError):
        duration("soon")
    with pytest.raises(argparse.ArgumentTypeError):
        size("big")


def test_command_lines_parse() -> None:
    p = argparse.ArgumentParser(prog="floe")
    add_parsers(p.add_subparsers(dest="command", required=True))
    a = p.parse_args(["compact", "--table", "default.t", "--sort", "a,b", "--data-dir", "/d",
                      "--snapshot-max-age", "2h", "--jars", "x.jar,y.jar", "--jars", "z.jar"])
    assert a.spark_command == "compact" and a.table == ["default.t"] and a.sort == "a,b"
    assert a.snapshot_max_age == dt.timedelta(hours=2) and a.data_dir == "/d"
    w = p.parse_args(["compact", "--watch", "--interval", "60", "--catalog", "postgresql://h/db",
                      "--namespace", "a", "--namespace", "`b.c`", "--rounds", "2"])
    assert w.watch and w.interval == 60 and w.catalog == "postgresql://h/db"
    assert w.namespace == ["a", "`b.c`"] and w.rounds == 2 and w.table is None
    q = p.parse_args(["sql", "SELECT 1", "--json", "--warehouse", "file:///w"])
    assert q.spark_command == "sql" and q.json and q.query == "SELECT 1"
    with pytest.raises(SystemExit):
        p.parse_args(["compact"])  # --table or --watch


def test_table_rendering() -> None:
    out = render_table(["name", "n"], [[("a", False), ("1", True)],
                                        [("longer", False), ("100", True)]])
    assert out.splitlines() == ["name   |   n", "-------+----", "a      |   1",
                                "longer | 100"]
    assert render_table(["x"], []).splitlines() == ["x", "-"]


def test_json_values() -> None:
    from pyspark.sql import Row

    value = Row(partition=1, key=b"\x00k", ts=dt.datetime(2024, 1, 2, 3, 4, 5),
                tags=["a"], m={"k": 1.5}, nan=float("nan"))
    assert jsonable(value) == {"partition": 1, "key": "AGs=", "ts": "2024-01-02T03:04:05",
                               "tags": ["a"], "m": {"k": 1.5}, "nan": "nan"}
    json.dumps(jsonable(value))


def test_s3_warehouse_uses_s3fileio_and_needs_its_jar(tmp_path: Path) -> None:
    assert catalog.s3_properties("file:///w", {"AWS_ENDPOINT_URL": "http://x"}) == {}
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert catalog.s3_properties("s3://bucket/w", env) == {
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.path-style-access": "true",
        "client.region": "eu-west-1",
    }
    try:
        jars.required_jars(f"sqlite:///{tmp_path}/catalog.db")
    except jars.SparkSetupError as e:
        pytest.skip(str(e))
    with pytest.raises(jars.SparkSetupError, match="iceberg-aws-bundle"):
        sess.session(data_dir=tmp_path, warehouse_url="s3://bucket/warehouse")
