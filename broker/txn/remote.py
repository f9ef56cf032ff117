"""WriteTxnMarkers (27) to another broker: how the transaction coordinator has a marker
written into a partition led elsewhere, and tells a group's coordinator that a transaction's
offsets committed or aborted (the partition `GROUP_MARKER_TOPIC`-<the group's slot>, as Kafka
writes the marker into the group's __consumer_offsets partition).

The small blocking `broker.client.Client` runs in a thread (`send` is called through
asyncio.to_thread), with a deadline for each whole response; a response frame is at most
MAX_FRAME bytes. Every failure to reach the broker or to read its answer is a
retriable error code for each partition asked about: the coordinator asks again after the
next cluster view. TRANSACTION_COORDINATOR_FENCED comes back as it is: the coordinator stops
(broker.txn.coordinator).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from broker.client import Client, KafkaClientError, nested
from broker.errors import ErrorCode

WRITE_TXN_MARKERS = 27
VERSION = 1
GROUP_MARKER_TOPIC = "__consumer_offsets"
TIMEOUT_S = 10.0  # connect, and each whole response
MAX_FRAME = 1 << 20  # a marker response is a few bytes a partition


@dataclass(frozen=True, slots=True)
class Marker:
    producer_id: int
    epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[tuple[str, int], ...]


def _request(markers: Iterable[Marker]) -> tuple[Any, ...]:
    marker_cls = nested(WRITE_TXN_MARKERS, VERSION, "WritableTxnMarker")
    topic_cls = nested(WRITE_TXN_MARKERS, VERSION, "WritableTxnMarkerTopic")
    out = []
    for m in markers:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in m.partitions:
            by_topic.setdefault(topic, []).append(partition)
        out.append(marker_cls(
            producer_id=m.producer_id, producer_epoch=m.epoch, transaction_result=m.commit,
            coordinator_epoch=m.coordinator_epoch,
            topics=tuple(topic_cls(name=t, partition_indexes=tuple(ps))
                         for t, ps in by_topic.items())))
    return tuple(out)


def send(
    address: str, markers: list[Marker], timeout_s: float = TIMEOUT_S
) -> dict[tuple[int, str, int], ErrorCode]:
    """Ask the broker at HOST:PORT to write `markers`: an error code for each (producer id,
    topic, partition) asked about (NETWORK_EXCEPTION / REQUEST_TIMED_OUT for all of them when
    the broker cannot be reached or answered badly; a partition it left unanswered is
    UNKNOWN_SERVER_ERROR). Blocking: run it in a thread."""
    asked = [(m.producer_id, t, p) for m in markers for t, p in m.partitions]
    try:
        with Client(address, timeout=timeout_s, client_id="floe-txn-coordinator",
                    max_frame=MAX_FRAME) as c:
            resp = c.request(WRITE_TXN_MARKERS, VERSION, markers=_request(markers))
    except TimeoutError:
        return dict.fromkeys(asked, ErrorCode.request_timed_out)
    except (KafkaClientError, OSError):
        return dict.fromkeys(asked, ErrorCode.network_exception)
    except Exception:  # bytes that do not decode: the peer's fault
        return dict.fromkeys(asked, ErrorCode.network_exception)
    codes = dict.fromkeys(asked, ErrorCode.unknown_server_error)
    for m in resp.markers:
        for t in m.topics:
            for p in t.partitions:
                key = (int(m.producer_id), str(t.name), int(p.partition_index))
                if key in codes:
                    try:
                        codes[key] = ErrorCode(p.error_code)
                    except ValueError:
                        codes[key] = ErrorCode.unknown_server_error
    return codes
