"""The network layer's framing: frames come out the same however the stream is cut."""

from __future__ import annotations

import random
from typing import Any

from broker.net import KafkaConnection


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


def _received(conn: KafkaConnection) -> list[bytes]:
    out: list[Any] = list(conn._inbox)
    conn._inbox.clear()
    return [bytes(f) for f in out]


def test_frames_are_the_same_wherever_the_stream_is_cut() -> None:
    rng = random.Random(1)
    frames = [rng.randbytes(n) for n in (0, 1, 3, 4, 5, 17, 300, 5000, 2, 0, 70000)]
    stream = _framed(frames)
    # every single cut point among the small frames and around the big one, then random
    # multi-cuts (chunks of 1 byte up to the whole stream)
    big = len(stream) - 70004
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
                conn.data_received(stream[prev:c])
                got += _received(conn)
            prev = c
        assert got == frames, cuts
        assert not conn._held and conn._held_bytes == 0 and not t.closed


def test_bytes_held_never_exceed_those_received() -> None:
    conn, t = _conn(max_request_bytes=100 << 20)
    conn.data_received((100 << 20).to_bytes(4, "big") + b"x" * 10)  # claims 100 MiB, sends 10
    assert conn._held_bytes == 14 and sum(len(h) for h in conn._held) == 14
    assert not t.closed and not conn._inbox


def test_a_size_outside_the_limit_closes_the_connection() -> None:
    for prefix in ((-1).to_bytes(4, "big", signed=True), (4097).to_bytes(4, "big")):
        for split in range(1, 5):  # also when the prefix itself comes in pieces
            conn, t = _conn(max_request_bytes=4096)
            conn.data_received(_framed([b"ok"]) + prefix[:split])
            conn.data_received(prefix[split:] + b"rest")
            assert t.closed
            conn.data_received(_framed([b"after"]))  # nothing more is framed once closing
            assert _received(conn) == [b"ok"]
