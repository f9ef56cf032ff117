"""The network layer's framing: frames come out the same however the stream is cut, and
what a size prefix claims costs nothing before its bytes arrive."""

from __future__ import annotations

import random
from typing import Any

from broker.net import RECEIVE_BUFFER, SMALL_FRAME, KafkaConnection


class _Transport:
    def __init__(self) -> None:
        self.closed = False
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def is_closing(self) -> bool:
        return self.closed


def _conn(max_request_bytes: int = 1 << 20) -> tuple[KafkaConnection, _Transport]:
    conn = KafkaConnection(ctx=None, max_request_bytes=max_request_bytes)  # type: ignore[arg-type]
    t = _Transport()
    conn.transport = t  # type: ignore[assignment]
    return conn, t


def _framed(frames: list[bytes]) -> bytes:
    return b"".join(len(f).to_bytes(4, "big") + f for f in frames)


def feed(conn: KafkaConnection, data: bytes, most: int | None = None) -> None:
    """What a transport does with `data` arriving: asks for a buffer, writes into it as much
    as fits (and at most `most` bytes per read), tells how much; again until all is in."""
    pos = 0
    while pos < len(data):
        buf = conn.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), len(data) - pos, most or len(data))
        buf[:n] = data[pos : pos + n]
        conn.buffer_updated(n)
        pos += n


def _received(conn: KafkaConnection) -> list[bytes]:
    out: list[Any] = list(conn._inbox)
    conn._inbox.clear()
    return [bytes(f) for f in out]


def test_frames_are_the_same_wherever_the_stream_is_cut() -> None:
    rng = random.Random(1)
    frames = [rng.randbytes(n) for n in (0, 1, 3, 4, 5, 17, 300, 5000, 2, 0, 70000, 3,
                                         SMALL_FRAME, SMALL_FRAME + 1, 3 * RECEIVE_BUFFER, 9)]
    stream = _framed(frames)
    # every single cut point among the small frames and around the big one, then random
    # multi-cuts (chunks of 1 byte up to the whole stream)
    big = len(_framed(frames[:10]))  # where the frames of more than a few bytes start
    cuttings = [[c] for c in [*range(big + 8), *range(len(stream) - 8, len(stream) + 1)]]
    cuttings += [sorted(rng.sample(range(len(stream)), k))
                 for k in (2, 5, 50, 500) for _ in range(20)]
    cuttings.append(list(range(1, len(stream))))  # one byte at a time
    for cuts in cuttings:
        conn, t = _conn()
        got: list[bytes] = []
        prev = 0
        for c in [*cuts, len(stream)]:
            if c > prev:
                feed(conn, stream[prev:c])
                got += _received(conn)
            prev = c
        assert got == frames, cuts
        assert conn._big is None and conn._start == conn._end == 0 and not t.closed


def test_frames_are_the_same_whatever_the_transport_reads_at_a_time() -> None:
    rng = random.Random(2)
    frames = [rng.randbytes(rng.choice((0, 7, 900, SMALL_FRAME + rng.randrange(-2, 3),
                                        rng.randrange(RECEIVE_BUFFER * 3))))
              for _ in range(40)]
    stream = _framed(frames)
    for most in (4095, 65536, RECEIVE_BUFFER - 1, RECEIVE_BUFFER + 5, None):
        conn, t = _conn(max_request_bytes=1 << 20)
        got: list[bytes] = []
        for i in range(0, len(stream), 1 << 20):  # arriving in MiB bursts, read `most` a time
            feed(conn, stream[i : i + (1 << 20)], most)
            got += _received(conn)
        assert got == frames and not t.closed, most


def _resident_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def test_a_size_prefix_alone_makes_nothing_resident() -> None:
    """A client claiming 100 MiB and sending 10 bytes gets a buffer for the frame at once
    (so the rest is received straight into it), but no page of it is written: the memory
    held is what was received. Seen failing with bytearray(size), which zeroes it all."""
    conns = []
    before = _resident_kib()
    for _ in range(8):  # 800 MiB claimed
        conn, t = _conn(max_request_bytes=100 << 20)
        feed(conn, (100 << 20).to_bytes(4, "big") + b"x" * 10)
        assert conn._big is not None and len(conn._big) == 100 << 20 and conn._big_got == 10
        assert not t.closed and not conn._inbox
        conns.append(conn)
    assert _resident_kib() - before < 64 << 10  # KiB: far under the 800 MiB claimed
    # and the frame, once whole, is the bytes sent
    conn = conns[0]
    feed(conn, b"y" * ((100 << 20) - 10), 1 << 20)
    (frame,) = _received(conn)
    assert frame[:10] == b"x" * 10 and frame[10:] == b"y" * ((100 << 20) - 10)


def test_a_request_the_memory_cannot_hold_costs_its_connection() -> None:
    """A buffer that cannot be had (the address space capped) closes that connection with a
    warning; the process and the other connections go on."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    other, _ = _conn()
    conn, t = _conn(max_request_bytes=1 << 40)
    with open("/proc/self/status") as f:
        size_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, ((size_kib << 10) + (256 << 20), hard))
    try:
        feed(conn, ((1 << 31) - 1).to_bytes(4, "big") + b"x")  # 2 GiB claimed
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert t.closed and conn._big is None
    feed(other, _framed([b"still", b"here"]))
    assert _received(other) == [b"still", b"here"]


def test_a_size_outside_the_limit_closes_the_connection() -> None:
    for prefix in ((-1).to_bytes(4, "big", signed=True), (4097).to_bytes(4, "big")):
        for split in range(1, 5):  # also when the prefix itself comes in pieces
            conn, t = _conn(max_request_bytes=4096)
            feed(conn, _framed([b"ok"]) + prefix[:split])
            feed(conn, prefix[split:] + b"rest")
            assert t.closed
            feed(conn, _framed([b"after"]))  # nothing more is framed once closing
            assert _received(conn) == [b"ok"]
