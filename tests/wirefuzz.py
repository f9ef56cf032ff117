"""Mutations of real request frames, and a bounded asyncio sender for them (wire fuzz test).

Everything is driven by one `random.Random(seed)`: given the same captured frames (sorted, so
capture order does not matter) and the same seed, `batches` yields the same frames.

Mutations (one to three stacked per frame): bit flips; random byte overwrites; an int16/32/64
overwritten with a hostile value (huge, negative, -1, 0); a hostile unsigned varint written or
inserted (2^32-1, 2^35-1, ten-byte, unterminated); the same values put where a string length
or an array count most likely is (found by the printable bytes that follow); truncation;
extension; tagged fields injected into the header, the body's last tagged section or
anywhere; the api key or version swapped (so the frame is read with another schema); one
frame's head spliced onto another's tail; for Produce, a record batch's header or records
mutated with its CRC fixed; and the 4-byte size prefix made to lie.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from crc32c import crc32c

HOSTILE_INTS = (0, 1, -1, -2, 0x7F, 0x80, 0xFF, 0x7FFF, -0x8000, 0xFFFF, 0x7FFFFFFF,
                -0x80000000, 0x3FFFFFFF, 0x10000, 0x7FFFFFFFFFFFFFFF, -0x8000000000000000)
HOSTILE_VARINTS = (
    b"\xff\xff\xff\xff\x0f",  # 2^32 - 1
    b"\xff\xff\xff\xff\x7f",  # 2^35 - 1
    b"\xff" * 9 + b"\x01",  # ten bytes
    b"\x80\x80\x80\x80\x80",  # never terminated
    b"\x80\x80\x80\x80\x08",  # 2^31
    b"\x00",  # null
    b"\x81\x80\x80\x80\x00",  # 1, not minimal
)


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Mutated:
    """Bytes to send (size prefix included) and what was done, for the failure report."""

    wire: bytes
    what: str


def _pos(rng: random.Random, frame: bytes | bytearray, start: int = 0) -> int:
    """A position in [start, len(frame)) (or len(frame) itself for a frame that short)."""
    lo = min(start, len(frame))
    return rng.randrange(lo, max(len(frame), lo + 1))


def bit_flip(rng: random.Random, f: bytearray) -> str:
    for _ in range(rng.randint(1, 4)):
        p = _pos(rng, f)
        if p < len(f):
            f[p] ^= 1 << rng.randrange(8)
    return "bitflip"


def byte_overwrite(rng: random.Random, f: bytearray) -> str:
    p = _pos(rng, f, 8)
    n = rng.randint(1, 8)
    f[p : p + n] = rng.randbytes(n)
    return f"bytes@{p}"


def int_overwrite(rng: random.Random, f: bytearray) -> str:
    width = rng.choice((2, 4, 4, 8))
    value = rng.choice(HOSTILE_INTS)
    fmt = {2: ">H", 4: ">I", 8: ">Q"}[width]
    raw = struct.pack(fmt, value & ((1 << (8 * width)) - 1))
    p = _pos(rng, f, 8)
    f[p : p + width] = raw
    return f"int{8 * width}={value}@{p}"


def varint_write(rng: random.Random, f: bytearray) -> str:
    v = rng.choice(HOSTILE_VARINTS)
    p = _pos(rng, f, 8)
    if rng.random() < 0.5:
        f[p : p + len(v)] = v
        return f"varint-over={v.hex()}@{p}"
    f[p:p] = v
    return f"varint-insert={v.hex()}@{p}"


def truncate(rng: random.Random, f: bytearray) -> str:
    n = rng.randrange(len(f)) if f else 0
    del f[n:]
    return f"truncate@{n}"


def extend(rng: random.Random, f: bytearray) -> str:
    n = rng.choice((1, 3, 17, 200, 4096))
    f += rng.randbytes(n) if rng.random() < 0.5 else bytes([rng.choice((0, 0xFF))]) * n
    return f"extend+{n}"


def _tagged(rng: random.Random) -> bytes:
    n = rng.randint(1, 3)
    out = bytearray(uvarint(n))
    for _ in range(n):
        size = rng.choice((0, 1, 5, 40))
        lie = rng.random() < 0.2
        out += uvarint(rng.choice((0, 1, 2, 3, 7, 99, 10_000)))
        out += uvarint(size + (rng.choice((1, 1000, 2**31)) if lie else 0))
        out += rng.randbytes(size)
    return bytes(out)


def _printable(b: bytes | bytearray) -> bool:
    return all(0x20 <= c < 0x7F for c in b)


def length_fields(f: bytes | bytearray) -> list[tuple[int, str]]:
    """Where a frame most likely holds string lengths and array counts: an int16 n (legacy)
    or a byte n+1 (compact) followed by n printable bytes is a string length; an int32 or a
    byte holding a small count right before one is an array count."""
    out: list[tuple[int, str]] = []
    for i in range(8, len(f) - 2):
        (n,) = struct.unpack_from(">h", f, i)
        if 0 < n <= len(f) - i - 2 and _printable(f[i + 2 : i + 2 + n]):
            out.append((i, "int16"))
            if i >= 4 and 0 < struct.unpack_from(">i", f, i - 4)[0] <= 1000:
                out.append((i - 4, "int32"))
        c = f[i] - 1
        if 0 < c <= len(f) - i - 1 and _printable(f[i + 1 : i + 1 + c]):
            out.append((i, "varint"))
            if 0 < f[i - 1] <= 100:
                out.append((i - 1, "varint"))
    return out


def length_overwrite(rng: random.Random, f: bytearray) -> str:
    """A hostile value in a (likely) string length or array count."""
    spots = length_fields(f)
    if not spots:
        return int_overwrite(rng, f)
    at, kind = rng.choice(spots)
    if kind == "int16":
        f[at : at + 2] = struct.pack(">h", rng.choice((-2, -1, 0x7FFF, -0x8000, 0x1000)))
    elif kind == "int32":
        f[at : at + 4] = struct.pack(">i", rng.choice((-2, -1, 0x7FFFFFFF, -0x80000000,
                                                       0x10000, 1 << 28)))
    else:
        f[at : at + 1] = rng.choice(HOSTILE_VARINTS)  # insert-over: the varint may be longer
    return f"length-{kind}@{at}"


def inject_tagged(rng: random.Random, f: bytearray) -> str:
    if len(f) < 10:
        return "inject-skipped"
    (client_id_len,) = struct.unpack_from(">h", f, 8)
    header_tags = 10 + max(client_id_len, 0)
    where = rng.random()
    if where < 0.4 and header_tags < len(f):  # the header's tagged section (flexible requests)
        f[header_tags : header_tags + 1] = _tagged(rng)
        return "tags-in-header"
    if where < 0.8 and f and f[-1] == 0:  # the body's last tagged section
        f[-1:] = _tagged(rng)
        return "tags-at-end"
    p = _pos(rng, f, 8)
    f[p:p] = _tagged(rng)
    return f"tags-insert@{p}"


def batch_spans(frame: bytes) -> list[tuple[int, int]]:
    """(start, end) of every record batch (magic 2, CRC-32C right) inside a frame."""
    spans = []
    p = 0
    while True:
        p = frame.find(b"\x02", p + 1)
        if p < 16:
            if p == -1:
                return spans
            continue
        start = p - 16
        (length,) = struct.unpack_from(">i", frame, start + 8)
        end = start + 12 + length
        crc = struct.unpack_from(">I", frame, start + 17)[0]
        if length >= 49 and end <= len(frame) and crc32c(frame[start + 21 : end]) == crc:
            spans.append((start, end))
            p = end - 1


def batch_inside(rng: random.Random, f: bytearray, spans: list[tuple[int, int]]) -> str:
    """Mutate a record batch's header fields or records and fix its CRC, so the broker
    stores or reads it instead of refusing it for the checksum."""
    start, end = rng.choice(spans)
    field_at = rng.choice((21, 22, 23, 27, 35, 43, 51, 53, 57, 61, -1))
    if field_at == 21 or field_at == 22:  # attributes: codec, timestamp type, txn, control
        f[start + 22] = rng.randrange(256) if rng.random() < 0.3 else (
            (f[start + 22] & ~0x07) | rng.randrange(8))
    elif field_at == -1 or start + field_at >= end:  # inside the records
        sub = bytearray(f[start + 61 : end])
        rng.choice((bit_flip, int_overwrite, varint_write, byte_overwrite))(rng, sub)
        del sub[end - start - 61 :]
        sub += bytes(max(0, end - start - 61 - len(sub)))
        f[start + 61 : end] = sub
    else:
        width = 8 if field_at in (27, 35, 43) else 2 if field_at == 51 else 4
        value = rng.choice(HOSTILE_INTS) & ((1 << (8 * width)) - 1)
        f[start + field_at : start + field_at + width] = value.to_bytes(width, "big")
    struct.pack_into(">I", f, start + 17, crc32c(bytes(f[start + 21 : end])))
    return f"batch@{start}+{field_at}"


def swap_api(rng: random.Random, f: bytearray, served: dict[int, tuple[int, int]]) -> str:
    """Read the frame with another schema: another version of its api, or another api."""
    if len(f) < 4:
        return "swap-skipped"
    key = struct.unpack_from(">h", f, 0)[0]
    if rng.random() < 0.5 or key not in served:
        key = rng.choice(sorted(served))
    lo, hi = served[key]
    version = rng.randint(lo, hi) if rng.random() < 0.9 else rng.choice((-1, hi + 1, 0x7FFF))
    struct.pack_into(">hh", f, 0, key, version)
    return f"as-api-{key}-v{version}"


@dataclass
class Mutator:
    frames: list[bytes]  # real frames, each without size prefix
    served: dict[int, tuple[int, int]]  # api key -> version range the broker serves
    rng: random.Random
    _groups: list[list[bytes]] = field(init=False)
    _spans: dict[bytes, list[tuple[int, int]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        by_api: dict[tuple[int, int], list[bytes]] = {}
        for fr in sorted(self.frames):
            by_api.setdefault(struct.unpack_from(">hh", fr, 0), []).append(fr)
        self._groups = [by_api[k] for k in sorted(by_api)]

    def pick(self) -> bytes:
        """A frame, every (api key, version) seen equally likely."""
        return self.rng.choice(self.rng.choice(self._groups))

    def mutate(self) -> Mutated:
        rng = self.rng
        base = self.pick()
        f = bytearray(base)
        ops: list[Callable[[random.Random, bytearray], str]] = [
            bit_flip, byte_overwrite, int_overwrite, int_overwrite, varint_write, varint_write,
            length_overwrite, length_overwrite, length_overwrite,
            truncate, extend, inject_tagged, inject_tagged,
            lambda r, b: swap_api(r, b, self.served),
        ]
        done = []
        if base[:2] == b"\x00\x00":  # Produce: often mutate inside a batch, CRC fixed
            spans = self._spans.get(base)
            if spans is None:
                spans = self._spans[base] = batch_spans(base)
            if spans and rng.random() < 0.6:
                for _ in range(rng.choice((1, 1, 2))):
                    done.append(batch_inside(rng, f, spans))
                return self._finish(base, f, done)
        for _ in range(rng.choice((1, 1, 2, 3))):
            if rng.random() < 0.05:  # splice with another frame
                other = self.pick()
                cut = _pos(rng, f)
                f = f[:cut] + other[_pos(rng, other) :]
                done.append(f"splice@{cut}")
            else:
                done.append(rng.choice(ops)(rng, f))
        return self._finish(base, f, done)

    def _finish(self, base: bytes, f: bytearray, done: list[str]) -> Mutated:
        rng = self.rng
        size = len(f)
        roll = rng.random()
        if roll < 0.03:
            size = rng.choice((-1, 0x7FFFFFFF, len(f) + 1000, max(len(f) - 5, 0)))
            done.append(f"size={size}")
        head = struct.pack(">i", size)
        api = struct.unpack_from(">hh", base, 0)
        return Mutated(head + bytes(f), f"api {api[0]} v{api[1]} ({len(base)} B): "
                       + ", ".join(done))


@dataclass
class Outcomes:
    answered: int = 0  # at least one response frame came back
    closed: int = 0  # the broker closed the connection
    waited: int = 0  # neither within the wait: we hung up
    connections: int = 0
    frames: int = 0


async def send_one_connection(address: tuple[str, int], batch: list[Mutated], wait_s: float,
                              out: Outcomes) -> None:
    """Send the frames back to back on a fresh connection, read until the broker answers
    them all, closes, or `wait_s` passes; then hang up."""
    out.connections += 1
    out.frames += len(batch)
    # asyncio.timeout, not wait_for: Python 3.11's wait_for can drop a connection made just
    # as it times out, and the socket leaks (python/cpython#81839; a ResourceWarning here)
    async with asyncio.timeout(5):
        reader, writer = await asyncio.open_connection(*address)
    responses = 0
    closed = False
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(b"".join(m.wire for m in batch))
            await writer.drain()
        deadline = time.monotonic() + wait_s
        while responses < len(batch):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                head = await asyncio.wait_for(reader.readexactly(4), left)
                (size,) = struct.unpack(">i", head)
                await asyncio.wait_for(reader.readexactly(size), max(left, 1.0))
                responses += 1
            except (asyncio.IncompleteReadError, ConnectionError):
                closed = True
                break
            except TimeoutError:
                break
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if responses:
        out.answered += 1
    elif closed:
        out.closed += 1
    else:
        out.waited += 1


def batches(mutator: Mutator, n_frames: int, max_per_connection: int) -> Iterator[list[Mutated]]:
    sent = 0
    while sent < n_frames:
        k = min(mutator.rng.randint(1, max_per_connection), n_frames - sent)
        sent += k
        yield [mutator.mutate() for _ in range(k)]
