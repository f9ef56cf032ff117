"""What Storage.read serves from the chunks the log returns.

What must survive: batches are served only when each lies inside its chunk's offset range and
starts after the previous one ends (a gap inside a chunk is legitimate: cleanup.policy=compact
drops records but keeps offsets); anything else raises ReadRaceError and nothing is served."""

from __future__ import annotations

import pytest

from broker.protocol import records
from broker.protocol.recordset import RecordSet
from broker.storage import serve_batches
from s3stream.log import ChunkData, ReadRaceError
from tests.rawclient import make_batch


def batch(base: int, n: int) -> bytes:
    buf = make_batch([f"v{base + i}".encode() for i in range(n)])
    records.assign_offsets(buf, records.validate(buf), base, None)
    return bytes(buf)


def bases(data: RecordSet) -> list[int]:
    return [h.base_offset for h in records.iter_headers(data.tobytes())]


def test_serves_from_the_batch_holding_the_offset_across_chunks() -> None:
    chunks = [ChunkData(0, 5, batch(0, 3) + batch(3, 3)), ChunkData(6, 7, batch(6, 2))]
    assert bases(serve_batches(chunks, 4, 1 << 20, True)) == [3, 6]


def test_a_compacted_gap_inside_a_chunk_is_served() -> None:
    chunks = [ChunkData(0, 9, batch(0, 2) + batch(7, 3))]  # offsets 2..6 compacted away
    assert bases(serve_batches(chunks, 3, 1 << 20, True)) == [7]


@pytest.mark.parametrize(
    "chunks",
    [
        [ChunkData(0, 5, batch(0, 3)), ChunkData(6, 9, batch(3, 3))],  # batch outside its chunk
        [ChunkData(0, 9, batch(5, 2) + batch(0, 3))],  # batches out of order
        [ChunkData(0, 4, batch(0, 3) + batch(3, 3))],  # a batch running past its chunk
    ],
)
def test_misplaced_batches_are_never_served(chunks: list[ChunkData]) -> None:
    with pytest.raises(ReadRaceError):
        serve_batches(chunks, 0, 1 << 20, True)
