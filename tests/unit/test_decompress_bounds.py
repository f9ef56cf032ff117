"""Bounded decompression of record batches (broker/protocol/records.py `decompress`).

What must hold: every codec's real output decompresses exactly; data that would inflate
beyond the bound, or is not valid for its codec, is a CorruptBatchError, never an allocation
of the size it claims (cramjam's Rust code aborts the process when such an allocation fails).
"""

from __future__ import annotations

import struct

import cramjam
import pytest

from broker.protocol.records import CorruptBatchError, decompress
from tests.integration.test_wire_hostile import zstd_rle_bomb

DATA = b"".join(f"record-{i:06d}-".encode() * 3 for i in range(20_000))  # ~1 MiB


def xerial(chunks: list[bytes]) -> bytes:
    """snappy-java's framing, as the Java client writes it."""
    out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    for c in chunks:
        raw = bytes(cramjam.snappy.compress_raw(c))
        out += struct.pack(">i", len(raw)) + raw
    return bytes(out)


COMPRESSED = {
    1: bytes(cramjam.gzip.compress(DATA)),
    2: bytes(cramjam.snappy.compress_raw(DATA)),
    3: bytes(cramjam.lz4.compress(DATA)),
    4: bytes(cramjam.zstd.compress(DATA)),
}


@pytest.mark.parametrize("codec", sorted(COMPRESSED))
def test_every_codec_round_trips(codec: int) -> None:
    assert decompress(codec, COMPRESSED[codec]) == DATA
    assert decompress(codec, memoryview(COMPRESSED[codec])) == DATA
    assert decompress(codec, COMPRESSED[codec], max_size=len(DATA)) == DATA  # exact fit


def test_snappy_java_framing_round_trips() -> None:
    assert decompress(2, xerial([DATA[:400_000], DATA[400_000:]])) == DATA


@pytest.mark.parametrize("codec", sorted(COMPRESSED))
def test_output_beyond_the_bound_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptBatchError, match="inflate beyond"):
        decompress(codec, COMPRESSED[codec], max_size=len(DATA) - 1)


def test_a_zstd_bomb_is_refused_without_inflating_it() -> None:
    """64 KB of zstd that claims 2 GiB: refused at a 16 MiB bound."""
    bomb = zstd_rle_bomb(2 << 30)
    assert len(bomb) < 70_000
    with pytest.raises(CorruptBatchError):
        decompress(4, bomb, max_size=16 << 20)
    assert decompress(4, zstd_rle_bomb(1 << 20)) == b"\0" * (1 << 20)


def test_snappy_java_chunks_count_toward_the_bound() -> None:
    with pytest.raises(CorruptBatchError):
        decompress(2, xerial([DATA, DATA]), max_size=len(DATA) + 10)
    with pytest.raises(CorruptBatchError):  # a chunk length running past the end
        decompress(2, xerial([DATA])[:-10] + struct.pack(">i", 10**9))


@pytest.mark.parametrize("codec", [1, 2, 3, 4, 5, 7])
def test_garbage_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptBatchError):
        decompress(codec, b"not compressed at all" * 10)
