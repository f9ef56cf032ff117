"""Transaction markers: the control batches EndTxn writes into every partition of a
transaction (Kafka's EndTransactionMarker).

A marker is a v2 batch with the transactional and control attributes set, the producer's id
and epoch, no sequence (-1), and one record whose
- key is the control record key: int16 version (0), int16 type (0 abort, 1 commit);
- value is the marker: int16 version (0), int32 coordinator epoch.
Consumers never hand control records to applications; read_committed consumers use the
abort markers, with Fetch's aborted_transactions, to drop the aborted records.
"""

from __future__ import annotations

import struct
import time

from crc32c import crc32c

from broker.protocol.recordcodec import read_varint
from broker.protocol.records import (
    CONTROL_BIT,
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
    BatchHeader,
    CorruptBatchError,
)

ABORT = 0
COMMIT = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


def _zigzag(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def control_batch(
    producer_id: int, epoch: int, commit: bool, coordinator_epoch: int,
    timestamp_ms: int | None = None,
) -> bytes:
    """The marker batch (base offset 0; the log assigns the real one)."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    key = _KEY.pack(0, COMMIT if commit else ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    rec = b"\x00" + _zigzag(0) + _zigzag(0) + _zigzag(len(key)) + key
    rec += _zigzag(len(value)) + value + _zigzag(0)
    body = _zigzag(len(rec)) + rec
    attrs = TRANSACTIONAL_BIT | CONTROL_BIT
    after_crc = struct.pack(">hiqqqhii", attrs, 0, ts, ts, producer_id, epoch, -1, 1) + body
    head = struct.pack(">qiib", 0, len(after_crc) + 9, 0, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def is_transactional(h: BatchHeader) -> bool:
    return bool(h.attributes & TRANSACTIONAL_BIT)


def marker_type(buf: bytes | bytearray | memoryview, h: BatchHeader) -> int | None:
    """ABORT or COMMIT for a control batch holding a transaction marker, else None (control
    batches of other kinds, unknown key versions)."""
    found = marker_of(buf, h)
    return None if found is None else found[0]


def marker_of(buf: bytes | bytearray | memoryview, h: BatchHeader) -> tuple[int, int] | None:
    """(ABORT or COMMIT, the coordinator epoch its value carries) for a control batch holding
    a transaction marker, else None. A value missing or too short reads as coordinator epoch
    0 (the lowest a coordinator writes)."""
    if not h.is_control or h.record_count < 1:
        return None
    body = bytes(buf[h.position + HEADER_SIZE : h.position + h.size])
    try:
        pos = _skip_varint(body, 0) + 1  # the record's length, its attributes (one byte)
        pos = _skip_varint(body, _skip_varint(body, pos))  # timestamp and offset deltas
        klen, pos = read_varint(body, pos)
        if klen < _KEY.size:
            return None
        version, kind = _KEY.unpack_from(body, pos)
        if version != 0 or kind not in (ABORT, COMMIT):
            return None
        vlen, pos = read_varint(body, pos + klen)
        coordinator_epoch = 0
        if vlen >= _VALUE.size:  # int16 version (0, or 1 with tagged fields after), int32
            _, coordinator_epoch = _VALUE.unpack_from(body, pos)
    except (IndexError, struct.error):
        raise CorruptBatchError("control record runs past its batch") from None
    return int(kind), int(coordinator_epoch)


def _skip_varint(buf: bytes, pos: int) -> int:
    return read_varint(buf, pos)[1]
