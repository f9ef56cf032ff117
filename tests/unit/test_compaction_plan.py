from __future__ import annotations

from broker.retention import retention_start
from s3stream.compaction import CompactionSettings, choose_wal_objects, plan_compaction
from s3stream.log import Chunk, Stream
from s3stream.metadata import ChunkRow, ObjectRow

S = CompactionSettings(min_age_ms=1000, max_bytes_per_run=250, stream_object_max_bytes=100)


def obj(oid: int, size: int = 100, created: int = 0) -> ObjectRow:
    return ObjectRow(oid, f"wal/{oid}", size, "wal", created)


def test_choose_takes_an_old_enough_prefix_within_budget() -> None:
    wal = [obj(3, created=0), obj(1, created=0), obj(2, created=0), obj(4, created=9_500)]
    assert [o.object_id for o in choose_wal_objects(wal, 10_000, S)] == [1, 2]  # budget 250
    assert [o.object_id for o in choose_wal_objects([obj(1, size=999)], 10_000, S)] == [1]
    young = [obj(1, created=9_500), obj(2, created=0)]
    assert choose_wal_objects(young, 10_000, S) == []  # a prefix: stops at the young one


def test_plan_groups_by_stream_and_splits_by_size_and_gaps() -> None:
    chunks = [
        ChunkRow(7, 0, 9, 1, 24, 60, 5), ChunkRow(7, 10, 19, 2, 24, 60, 6),  # 120 > 100: split
        ChunkRow(8, 0, 4, 1, 84, 10, 1), ChunkRow(8, 5, 5, 2, 84, 10, 2),
        ChunkRow(9, 0, 0, 1, 94, 5, 1), ChunkRow(9, 3, 3, 2, 94, 5, 1),  # a gap: split
    ]
    plan = plan_compaction([obj(1), obj(2)], chunks, S)
    runs = [(p.stream_id, p.base_offset, p.last_offset) for p in plan.stream_objects]
    assert runs == [(7, 0, 9), (7, 10, 19), (8, 0, 5), (9, 0, 0), (9, 3, 3)]


def test_retention_by_time_and_bytes_moves_start_past_whole_chunks() -> None:
    st = Stream(1, 0, 30, 30)
    for base, ts in ((0, 100), (10, 200), (20, 300)):
        st.add_chunk(Chunk(base, base + 9, 1, 0, 50, ts))
    assert retention_start(st, -1, -1, 1000) == 0
    assert retention_start(st, 850, -1, 1000) == 10  # chunk 0's newest record is too old
    assert retention_start(st, 1, -1, 1000) == 30  # everything expired
    assert retention_start(st, -1, 100, 1000) == 10  # keep at most 100 bytes
    assert retention_start(st, -1, 101, 1000) == 0  # Kafka: only while size - chunk >= limit
    assert retention_start(st, -1, 150, 1000) == 0
