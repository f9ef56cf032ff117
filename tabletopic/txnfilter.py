"""What a table topic's writer takes from the log: exactly what a read_committed consumer sees.

- Never beyond the partition's last stable offset (LSO): records of a transaction still open
  are not read until it ends (the writer reads them then, committed or aborted).
- Records of aborted transactions are dropped, by the aborted ranges of the range read, with
  the consumer's algorithm (KIP-98): an aborted transaction of a producer starts at its first
  offset and ends at that producer's ABORT marker.
- Control batches (the markers) are no rows.

The writer still moves its offsets past aborted records and markers: they are consumed, so
the table's `floe.offsets` reach the log end while the table holds committed data only.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.engine import StorageEngine
from broker.protocol.records import TRANSACTIONAL_BIT, BatchHeader
from broker.txn.markers import ABORT, marker_type
from tabletopic.columnar import Parts


@dataclass(frozen=True, slots=True)
class CommittedBatches:
    batches: list[BatchHeader]  # the batches of `data` whose records a consumer is handed
    next_offset: int  # where the next read starts (past dropped records and markers too)


def committed_batches(
    storage: StorageEngine, topic: str, partition: int, data: bytes | Parts, offset: int,
    lso: int,
) -> CommittedBatches | None:
    """Which batches of `data` hold what a read_committed consumer is given from `offset`
    (their records at or after `offset`), or None when no whole batch of `data` lies below
    `lso`; they are not decoded here (tabletopic.columnar does that, off the event loop).
    `lso` must be taken before this call (the aborted ranges are taken here, after it: a
    transaction that ended before the LSO was taken has its marker, and so its aborted range,
    in place)."""
    parts = Parts.of(data)
    headers = [h for h in parts.headers() if h.last_offset < lso]
    if not headers:
        return None
    pending = sorted(
        storage.aborted_transactions(topic, partition, offset, lso), key=lambda a: a[1]
    )
    aborting: set[int] = set()  # producers whose records are currently aborted
    out: list[BatchHeader] = []
    for h in headers:
        while pending and pending[0][1] <= h.last_offset:
            aborting.add(pending.pop(0)[0])
        transactional = bool(h.attributes & TRANSACTIONAL_BIT)
        if h.is_control:
            if transactional and marker_type(*parts.batch(h)) == ABORT:
                aborting.discard(h.producer_id)
            continue
        if transactional and h.producer_id in aborting:
            continue
        out.append(h)
    return CommittedBatches(out, max(offset, headers[-1].next_offset))
