"""The broker on S3 (moto's S3 server): acknowledged records live in the bucket, not on the
broker's disk. Produce with acks=all, SIGKILL the broker, start a new broker process with an
empty data directory on the same bucket and metadata database, and read every acknowledged
record back at the offset it was acknowledged with."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.kafkaread import consume_all
from tests.s3server import TEST_AWS_ENV, UNSET_AWS_ENV, bucket_listing, moto_s3

pytestmark = pytest.mark.integration

BUCKET = "floe-test"
TOPIC = "s3durable"
PARTITIONS = 3


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for k, v in TEST_AWS_ENV.items():
        monkeypatch.setenv(k, v)  # broker processes inherit the environment
    for k in UNSET_AWS_ENV:
        monkeypatch.delenv(k, raising=False)
    with moto_s3() as endpoint:
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        c.create_bucket(Bucket=BUCKET)
        c.close()
        yield endpoint


def test_acked_records_survive_on_s3_with_a_new_data_dir(tmp_path: Path, s3_endpoint: str) -> None:
    store_url = f"s3://{BUCKET}/data?endpoint={s3_endpoint}&region=us-east-1"
    meta_url = f"sqlite:///{tmp_path / 'shared-meta' / 'meta.db'}"
    args = ["--object-store", store_url, "--metadata", meta_url]

    first = BrokerProcess(data_dir=tmp_path / "data-1", extra_args=args).start()
    try:
        admin = AdminClient({"bootstrap.servers": first.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(10)
        acked: dict[tuple[int, int], bytes] = {}
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                errors.append(str(err))

        producer = Producer(
            {
                "bootstrap.servers": first.bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 5000,
                "retries": 0,
                "reconnect.backoff.max.ms": 200,
            }
        )
        i = 0
        deadline = time.monotonic() + 60
        while len(acked) < 3000 and time.monotonic() < deadline:
            value = f"v{i}-".encode() + b"x" * (i % 300)
            producer.produce(TOPIC, value=value, partition=i % PARTITIONS, on_delivery=on_delivery)
            i += 1
            producer.poll(0)
            if i % 500 == 0:
                producer.poll(0.01)
        assert len(acked) >= 3000, f"only {len(acked)} acks; errors {errors[:3]}; {first.log()}"
        first.kill()  # right after acks: no flush, no shutdown hook
        producer.flush(15)  # the rest fail: the broker is gone
        acked_before_kill = dict(acked)
    finally:
        first.stop()

    keys = bucket_listing(s3_endpoint, BUCKET, "data/")
    assert any(k.startswith("data/wal/") for k in keys), keys[:10]
    assert all(k.startswith("data/") for k in bucket_listing(s3_endpoint, BUCKET))
    assert not (tmp_path / "data-1" / "objects").exists(), "objects were written to local disk"

    # a new process, an empty new data directory: only the bucket and the metadata remain
    second = BrokerProcess(data_dir=tmp_path / "data-2", extra_args=args).start()
    try:
        stored = consume_all(second.bootstrap, TOPIC, PARTITIONS)
        missing = [k for k in acked_before_kill if k not in stored]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
        wrong = [k for k, v in acked_before_kill.items() if stored[k] != v]
        assert not wrong, f"records at {wrong[:5]} changed"
        for p in range(PARTITIONS):  # offsets dense per partition: none reused, none skipped
            offsets = sorted(o for (q, o) in stored if q == p)
            assert offsets == list(range(len(offsets)))

        # the new broker goes on from the durable end, never reusing an offset
        after: dict[tuple[int, int], bytes] = {}
        p2 = Producer({"bootstrap.servers": second.bootstrap, "acks": "all"})
        for j in range(30):
            p2.produce(
                TOPIC,
                value=f"after{j}".encode(),
                partition=j % PARTITIONS,
                on_delivery=lambda e, m: (
                    after.__setitem__((m.partition(), m.offset()), m.value()) if e is None else None
                ),
            )
        assert p2.flush(15) == 0
        assert len(after) == 30 and not set(after) & set(stored)
        final = consume_all(second.bootstrap, TOPIC, PARTITIONS)
        assert all(final[k] == v for k, v in {**acked_before_kill, **after}.items())
    finally:
        second.stop()
