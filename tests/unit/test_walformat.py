from __future__ import annotations

import pytest

from s3stream import walformat


def test_roundtrip_and_positions() -> None:
    chunks = [(1, 0, 9, b"a" * 100), (7, 50, 50, b"b" * 10), (2, 3, 4, b"")]
    blob, entries = walformat.encode(42, chunks)
    object_id, decoded = walformat.decode_index(blob)
    assert object_id == 42
    assert decoded == entries
    for e, (_sid, _b, _l, data) in zip(entries, chunks, strict=True):
        assert blob[e.position : e.position + e.length] == data


@pytest.mark.parametrize("where", ["magic", "chunk", "index"])
def test_corruption_is_detected(where: str) -> None:
    blob, entries = walformat.encode(1, [(1, 0, 0, b"payload-bytes")])
    bad = bytearray(blob)
    pos = {"magic": 0, "chunk": entries[0].position + 2, "index": len(blob) - 3}[where]
    bad[pos] ^= 0x40
    with pytest.raises(walformat.WalFormatError):
        walformat.decode_index(bytes(bad))


def test_unknown_version_is_refused() -> None:
    blob, _ = walformat.encode(1, [(1, 0, 0, b"x")])
    bad = bytearray(blob)
    bad[4] = 99
    with pytest.raises(walformat.WalFormatError, match="version"):
        walformat.decode_index(bytes(bad))


def test_parts_make_exactly_the_encoded_object() -> None:
    """The WAL writes `encode_parts` (the chunks as given, not joined): the same bytes, index
    and size as `encode`."""
    chunks: list[tuple[int, int, int, walformat.Part]] = [
        (1, 10, 15, b"a" * 100), (7, 70, 75, bytearray(b"b" * 7)), (2, 20, 25, b""),
        (9, 90, 95, memoryview(b"de"))]
    blob, entries = walformat.encode(42, [(s, b, e, bytes(d)) for s, b, e, d in chunks])
    parts, size, part_entries = walformat.encode_parts(42, chunks)
    assert b"".join(parts) == blob and size == len(blob) and part_entries == entries
    assert walformat.decode_index(blob) == (42, entries)
    assert any(p is chunks[1][3] for p in parts)  # the chunks' bytes themselves, not copies
