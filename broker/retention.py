"""Retention: `retention.ms` and `retention.bytes` move a partition's log start offset past
whole chunks (Kafka deletes whole segments); the object GC deletes what nobody references."""

from __future__ import annotations

import logging
import time

from broker.storage import Storage, Topic
from s3stream.log import Stream

log = logging.getLogger(__name__)


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


async def apply_retention(storage: Storage) -> int:
    """One pass over every topic with a delete policy; returns how many partitions moved."""
    moved = 0
    now = int(time.time() * 1000)
    for topic in list(storage.topics.values()):
        moved += await _topic(storage, topic, now)
    return moved


async def _topic(storage: Storage, topic: Topic, now: int) -> int:
    policy = topic.config("cleanup.policy")
    assert isinstance(policy, list)
    if "delete" not in policy:
        return 0
    retention_ms = topic.config("retention.ms")
    retention_bytes = topic.config("retention.bytes")
    assert isinstance(retention_ms, int) and isinstance(retention_bytes, int)
    moved = 0
    for sid in topic.streams:
        st = storage.log.streams.get(sid)
        if st is None:
            continue
        start = retention_start(st, retention_ms, retention_bytes, now)
        if start > st.start_offset:
            await storage.log.truncate(sid, start)
            log.info("retention: %s moved log start to %d", topic.name, start)
            moved += 1
    return moved
