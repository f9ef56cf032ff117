"""`floe sql` / `floe compact` reach the broker's warehouse with the same settings: an S3
warehouse URL's location goes to Spark's Iceberg catalog without its query, and its
`endpoint`, `region` and `path_style` become S3FileIO properties. Unit level: Spark cannot
reach S3 on this machine (no iceberg-aws-bundle), so no Spark session is started here."""

from __future__ import annotations

from spark_compaction import session as sess

URL = "s3://lake/tables?endpoint=http://minio:9000&region=eu-central-1&path_style=true"


def test_the_catalog_gets_the_location_without_the_query() -> None:
    conf = sess.spark_conf("sqlite:////d/catalog.db", URL)
    assert conf["spark.sql.catalog.floe.warehouse"] == "s3://lake/tables"
    assert sess.catalog_properties("sqlite:////d/c.db", "file:///d/w")["warehouse"] == "file:///d/w"


def test_s3_settings_come_from_the_warehouse_url() -> None:
    env = {"AWS_ENDPOINT_URL": "http://elsewhere:1", "AWS_REGION": "us-west-2"}
    assert sess.s3_properties(URL, env) == {
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": "http://minio:9000",
        "s3.path-style-access": "true",
        "client.region": "eu-central-1",
    }
    # without parameters: the AWS environment, as before
    assert sess.s3_properties("s3://lake/tables", env) == {
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": "http://elsewhere:1",
        "s3.path-style-access": "true",
        "client.region": "us-west-2",
    }
