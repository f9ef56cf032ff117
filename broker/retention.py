"""Retention: `retention.ms` and `retention.bytes` move a partition's log start offset past
whole chunks (Kafka deletes whole segments); the object GC deletes what nobody references.
The s3stream engine applies it (`broker.storage.Storage.apply_retention`)."""

from __future__ import annotations

from s3stream.log import Stream


def retention_start(st: Stream, retention_ms: int, retention_bytes: int, now_ms: int) -> int:
    """The start offset retention allows for a stream (never below the current one)."""
    start = st.start_offset
    chunks = [c for c in st.chunks if c.last_offset >= st.start_offset]
    if retention_ms >= 0:
        for c in chunks:
            if c.max_timestamp >= now_ms - retention_ms:
                start = max(start, c.base_offset)
                break
        else:
            start = max(start, st.end_offset)
    if retention_bytes >= 0:
        total = sum(c.length for c in chunks)
        for c in chunks:
            if total - c.length < retention_bytes:
                break
            total -= c.length
            start = max(start, c.last_offset + 1)
    return start
