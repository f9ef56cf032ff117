"""Spark fixtures: one SparkSession for every Spark test (it takes ~10 s to start), on a
throwaway broker-like data directory whose catalog pyiceberg writes as the broker does."""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyspark.sql import SparkSession


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: needs pyspark, the Iceberg runtime and a JDK")


@dataclass
class SparkEnv:
    spark: SparkSession
    data_dir: Path
    catalog: SqlCatalog  # pyiceberg's view of the same catalog, named "floe" like the broker's


def collect_garbage() -> None:
    """pyspark leaves the sockets of collect() and py4j connections to the garbage collector,
    which warns (ResourceWarning; an error under this project's filterwarnings): collect them
    here, where that is expected, not during some later test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture(autouse=True)
def _spark_garbage() -> Iterator[None]:
    yield
    collect_garbage()


def _unavailable(why: str) -> NoReturn:
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"Spark unavailable: {why}; CI is set, so this fails", pytrace=False)
    pytest.skip(f"Spark unavailable: {why}")


@pytest.fixture(scope="package")  # stopped once the Spark tests are done
def spark_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEnv]:
    try:
        import pyspark  # noqa: F401
        from pyiceberg.catalog.sql import SqlCatalog

        from spark_compaction.jars import SparkSetupError
        from spark_compaction.session import session
    except ImportError as e:
        _unavailable(str(e))
    data_dir = tmp_path_factory.mktemp("floe-spark")
    catalog = SqlCatalog(
        "floe",
        uri=f"sqlite:///{data_dir / 'catalog.db'}",
        warehouse=(data_dir / "warehouse").as_uri(),
    )
    try:
        spark = session(data_dir=data_dir, quick_start=True)
    except SparkSetupError as e:
        _unavailable(str(e))
    try:
        yield SparkEnv(spark, data_dir, catalog)
    finally:
        spark.stop()
        collect_garbage()
