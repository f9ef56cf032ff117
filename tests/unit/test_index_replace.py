"""The in-memory index's side of a compaction (s3stream.index `_replaced`): a stream's old
chunks (in compacted WAL objects) swapped for their copies in a stream object. The usual case,
one run of the stream's list, is spliced in place; anything else (chunks between them that
stay, an old chunk the index does not hold) goes the long way, and either way the list keeps
every chunk that was not replaced, in offset order, and nothing twice."""

from __future__ import annotations

from s3stream.index import Chunk, Stream, _replaced
from s3stream.metadata import ChunkRow


def chunk(base: int, last: int, obj: int) -> Chunk:
    return Chunk(base, last, obj, 0, 10, 0)


def row(c: Chunk) -> ChunkRow:
    return ChunkRow(1, c.base_offset, c.last_offset, c.object_id, c.position, c.length,
                    c.max_timestamp)


def stream(chunks: list[Chunk]) -> Stream:
    st = Stream(stream_id=1, start_offset=0, end_offset=chunks[-1].last_offset + 1,
                next_offset=chunks[-1].last_offset + 1)
    st.set_chunks(chunks)
    return st


def spans(chunks: list[Chunk]) -> list[tuple[int, int, int]]:
    return [(c.base_offset, c.last_offset, c.object_id) for c in chunks]


def test_a_run_in_the_middle_is_spliced() -> None:
    before = [chunk(0, 9, 1), chunk(10, 19, 5), chunk(20, 29, 6), chunk(30, 39, 7),
              chunk(40, 49, 8)]
    st = stream(before)
    old = [row(c) for c in before[1:4]]
    out = _replaced(st, old[::-1], [chunk(10, 39, 100)])  # any order in, offset order out
    assert spans(out) == [(0, 9, 1), (10, 39, 100), (40, 49, 8)]
    assert spans(st.chunks) == spans(before)  # a new list: readers' snapshots unchanged


def test_a_run_at_either_end_is_spliced() -> None:
    before = [chunk(0, 9, 5), chunk(10, 19, 6), chunk(20, 29, 7)]
    assert spans(_replaced(stream(before), [row(c) for c in before[:2]],
                           [chunk(0, 19, 100)])) == [(0, 19, 100), (20, 29, 7)]
    assert spans(_replaced(stream(before), [row(c) for c in before[1:]],
                           [chunk(10, 29, 100)])) == [(0, 9, 5), (10, 29, 100)]


def test_a_chunk_that_stays_between_old_ones_is_kept() -> None:
    before = [chunk(0, 9, 5), chunk(10, 19, 9), chunk(20, 29, 6)]
    old = [row(before[0]), row(before[2])]  # not one run: the long way
    out = _replaced(stream(before), old, [chunk(0, 9, 100), chunk(20, 29, 100)])
    assert spans(out) == [(0, 9, 100), (10, 19, 9), (20, 29, 100)]


def test_an_old_chunk_the_index_lacks_drops_nothing_else() -> None:
    before = [chunk(0, 9, 5), chunk(10, 19, 6), chunk(20, 29, 7)]
    old = [row(before[1]), ChunkRow(1, 30, 39, 8, 0, 10, 0)]  # 30-39: not in this index
    out = _replaced(stream(before), old, [chunk(10, 19, 100)])
    assert spans(out) == [(0, 9, 5), (10, 19, 100), (20, 29, 7)]
