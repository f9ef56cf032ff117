"""kio's ProduceRequest as broker/protocol/producerequest.py reads it, for comparisons."""

from __future__ import annotations

from typing import Any

from broker.protocol.producerequest import PartitionData, ProduceRequest, TopicData


def from_kio(req: Any) -> ProduceRequest:
    return ProduceRequest(
        req.transactional_id,
        req.acks,
        round(req.timeout.total_seconds() * 1000),
        [
            TopicData(t.name, [
                PartitionData(p.index, None if p.records is None else memoryview(p.records))
                for p in t.partition_data
            ])
            for t in req.topic_data
        ],
    )


def same(decoded: object, req: Any) -> bool:
    """`decoded` (what decode_request returned) is `req` (a kio request) read back."""
    if getattr(req, "__api_key__", None) == 0:
        return decoded == from_kio(req)
    return decoded == req
