"""What a topic's configs demand of produced batches, checked (and applied) before append.

- `cleanup.policy` with `compact`: every record needs a key (Kafka: INVALID_RECORD, "Compacted
  topic cannot accept message without key"); nothing of the partition's record set is appended.
- `message.timestamp.before.max.ms` / `after.max.ms` / `difference.max.ms` (CreateTime topics):
  every record's timestamp must be within [now - before, now + after] (the deprecated
  difference bounds both sides); otherwise INVALID_TIMESTAMP.
- `compression.type`: `producer` keeps each batch as sent; a codec re-encodes batches sent
  with another codec (records, headers, timestamps, producer id / epoch / sequence kept).
- `max.message.bytes` (default: the broker's `message.max.bytes`): every batch as sent and as
  stored must fit, else MESSAGE_TOO_LARGE.
"""

from __future__ import annotations

import time

from broker.config import TopicConfig
from broker.errors import ErrorCode, KafkaError
from broker.protocol import records
from broker.protocol.recordcodec import CODECS, decode_raw, recompress
from broker.protocol.records import Buffer

_NO_LIMIT = 2**63 - 1


def check_size(batches: list[records.BatchHeader], config: TopicConfig) -> None:
    max_size = config.max_message_bytes
    for h in batches:
        if h.size > max_size:
            raise KafkaError(
                ErrorCode.message_too_large,
                f"batch of {h.size} bytes exceeds max.message.bytes {max_size}",
            )


def check_keys(data: Buffer, batches: list[records.BatchHeader], config: TopicConfig) -> None:
    if not config.compact:
        return
    for h in batches:
        if h.is_control:
            continue
        for r in decode_raw(data, h):
            if r.key is None:
                raise KafkaError(
                    ErrorCode.invalid_record,
                    f"Compacted topic cannot accept message without key (offset delta"
                    f" {r.offset_delta})",
                )


def check_timestamps(
    data: Buffer, batches: list[records.BatchHeader], config: TopicConfig, now_ms: int
) -> None:
    if config.log_append_time:
        return
    diff = config.message_timestamp_difference_max_ms
    before = min(config.message_timestamp_before_max_ms, diff)
    after = min(config.message_timestamp_after_max_ms, diff)
    if before == _NO_LIMIT and after == _NO_LIMIT:
        return
    low = now_ms - before if before != _NO_LIMIT else None
    high = now_ms + after if after != _NO_LIMIT else None
    for h in batches:
        if h.is_control:
            continue
        for offset, ts in records.record_timestamps(data, h):
            if (low is not None and ts < low) or (high is not None and ts > high):
                raise KafkaError(
                    ErrorCode.invalid_timestamp,
                    f"timestamp {ts} of record {offset - h.base_offset} is out of range"
                    f" [now - {before} ms, now + {after} ms] (message.timestamp.*.max.ms)",
                )


def apply(data: Buffer, config: TopicConfig) -> tuple[Buffer, list[records.BatchHeader]]:
    """Validate a produced record set against its topic's configs; returns the bytes to store
    and their batch headers (re-encoded if the topic's compression.type asks for it).
    Raises KafkaError; the caller appends nothing then."""
    try:
        batches = records.validate(data)
    except records.UnsupportedMagicError as e:
        raise KafkaError(ErrorCode.unsupported_for_message_format, str(e)) from None
    except records.CorruptBatchError as e:
        raise KafkaError(ErrorCode.corrupt_message, str(e)) from None
    check_size(batches, config)
    try:
        check_keys(data, batches, config)
        check_timestamps(data, batches, config, int(time.time() * 1000))
        codec = config.compression_type
        if codec != "producer":
            target = CODECS[codec]
            if any(h.compression != target and not h.is_control for h in batches):
                data = b"".join(recompress(data, h, target) for h in batches)
                batches = records.iter_headers(data)
                check_size(batches, config)
    except KafkaError:
        raise
    except Exception as e:  # a body that does not decompress, records that do not parse
        raise KafkaError(ErrorCode.corrupt_message, f"records do not decode: {e!r}") from None
    return data, batches
