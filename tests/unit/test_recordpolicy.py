"""Produce-side topic configs (broker/recordpolicy.py), checked against aiokafka's independent
record batch encoder and decoder."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker import recordpolicy
from broker.errors import KafkaError
from broker.storage import Topic

CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RECORDS = [
    (i, 1_700_000_000_000 + i * 1000, b"k%d" % i if i % 3 else None,
     None if i == 4 else b"value-%d " % i * 40, [("h", b"x"), ("n", None)])
    for i in range(9)
]


def batch(codec: int, producer: tuple[int, int, int] = (77, 3, 10)) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=producer[0],
        producer_epoch=producer[1], base_sequence=producer[2], batch_size=1 << 20,
    )
    for offset, ts, key, value, headers in RECORDS:
        b.append(offset, ts, key, value, headers)
    return bytes(b.build())


def topic(**configs: str) -> Topic:
    return Topic("t", uuid.uuid4(), {k.replace("_", "."): v for k, v in configs.items()})


def decoded(data: bytes) -> tuple[DefaultRecordBatch, list[tuple[Any, ...]]]:
    d = DefaultRecordBatch(data)
    assert d.validate_crc()
    return d, [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in d]


@pytest.mark.parametrize("target", list(CODECS))
@pytest.mark.parametrize("source", list(CODECS.values()))
def test_compression_type_reencodes_batches_with_every_field_kept(
    source: int, target: str
) -> None:
    """Must survive: a batch sent with any codec is stored with the topic's compression.type
    codec, and aiokafka decodes the same records (offsets, timestamps, keys, null values,
    headers) and the same producer id / epoch / base sequence, with a valid CRC."""
    sent = batch(source)
    stored, headers = recordpolicy.apply(sent, topic(compression_type=target).config)
    d, got = decoded(stored)
    assert d.compression_type == CODECS[target]
    assert headers[0].compression == CODECS[target]
    assert got == decoded(sent)[1]
    assert (d.producer_id, d.producer_epoch, d.base_sequence) == (77, 3, 10)


def test_producer_compression_keeps_the_batch_as_sent() -> None:
    """Must survive: compression.type=producer (the default) stores the exact bytes sent."""
    sent = batch(1)
    assert recordpolicy.apply(sent, topic().config)[0] == sent


def test_size_limit_applies_to_the_stored_batch_and_follows_config_changes() -> None:
    """Must survive: max.message.bytes is checked on the batch as stored, a broker default
    (message.max.bytes) applies when the topic sets none, and a changed topic config takes
    effect on the next append (parsed values are cached per configs dict)."""
    sent = batch(0, (-1, -1, -1))
    t = topic()
    t.defaults = {"max.message.bytes": str(len(sent) - 1)}
    with pytest.raises(KafkaError) as e:
        recordpolicy.apply(sent, t.config)
    assert e.value.code == 10  # MESSAGE_TOO_LARGE
    t.configs = {"max.message.bytes": str(len(sent))}
    recordpolicy.apply(sent, t.config)
    # a zstd batch that fits as sent but not once stored uncompressed
    small = batch(4, (-1, -1, -1))
    assert len(small) < len(sent)
    t.configs = {"max.message.bytes": str(len(small)), "compression.type": "uncompressed"}
    with pytest.raises(KafkaError) as e:
        recordpolicy.apply(small, t.config)
    assert e.value.code == 10


def test_keyless_records_are_refused_only_by_compacted_topics() -> None:
    """Must survive: one keyless record makes the whole record set INVALID_RECORD on a
    compact (or compact,delete) topic; delete topics take it."""
    sent = batch(2)
    for policy in ("compact", "compact,delete"):
        with pytest.raises(KafkaError) as e:
            recordpolicy.apply(sent, topic(cleanup_policy=policy).config)
        assert e.value.code == 87
    recordpolicy.apply(sent, topic(cleanup_policy="delete").config)


def test_timestamp_bounds() -> None:
    """Must survive: CreateTime records outside [now - before, now + after] are refused with
    INVALID_TIMESTAMP, the deprecated difference bounds both sides, LogAppendTime topics are
    not checked."""
    sent = batch(0)  # timestamps in 2023
    for key in ("before", "difference"):
        with pytest.raises(KafkaError) as e:
            recordpolicy.apply(sent, topic(**{f"message_timestamp_{key}_max_ms": "1000"}).config)
        assert e.value.code == 32
    recordpolicy.apply(sent, topic(message_timestamp_after_max_ms="1000").config)
    lenient = str(int(time.time() * 1000) - 1_600_000_000_000)
    recordpolicy.apply(sent, topic(message_timestamp_before_max_ms=lenient).config)
    recordpolicy.apply(sent, topic(message_timestamp_before_max_ms="1000",
                                   message_timestamp_type="LogAppendTime").config)


def test_lz4_frames_have_independent_blocks() -> None:
    """Must survive: re-encoded LZ4 bodies are frames with independent blocks (FLG bit 5),
    which the Java client requires ("Dependent block stream is unsupported")."""
    from broker.protocol.recordcodec import compress

    frame = compress(3, b"abc" * 100_000)
    assert frame[:4] == bytes.fromhex("04224d18")
    assert frame[4] & 0x20, f"FLG {frame[4]:08b}: linked blocks"


def test_a_body_that_does_not_decompress_is_corrupt_message() -> None:
    """Must survive: a batch with a valid CRC whose compressed body is garbage is answered
    CORRUPT_MESSAGE when a topic config needs its records (compaction key check,
    recompression, timestamp bounds), not an exception that costs the connection. (records.
    decompress raises CorruptBatchError since 710c7e5; recordpolicy also maps any other
    decoding failure to CORRUPT_MESSAGE.)"""
    import struct

    from crc32c import crc32c

    good = batch(4, (-1, -1, -1))
    body = b"\x00" * 40  # not a zstd frame
    after_crc = good[21:61] + body
    head = struct.pack(">qiib", 0, len(after_crc) + 9, -1, 2)
    bad = head + struct.pack(">I", crc32c(after_crc)) + after_crc
    for configs in ({"cleanup_policy": "compact"}, {"compression_type": "gzip"},
                    {"message_timestamp_before_max_ms": "1000"}):
        with pytest.raises(KafkaError) as e:
            recordpolicy.apply(bad, topic(**configs).config)
        assert e.value.code == 2, configs  # CORRUPT_MESSAGE
    recordpolicy.apply(bad, topic().config)  # nothing needs the records: stored as sent
