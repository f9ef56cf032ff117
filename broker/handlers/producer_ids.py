"""InitProducerId (22): ids for idempotent producers (transactions are not supported yet)."""

from __future__ import annotations

from typing import Any

from broker.errors import ErrorCode
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, resp
from broker.protocol.codec import RequestHead


@api(22, 0, 4)
async def init_producer_id(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    if req.transactional_id is not None:
        return build(
            resp(head),
            throttle_time=ZERO_MS,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    pid, epoch = await ctx.storage.init_producer_id(
        getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1)
    )
    return build(
        resp(head),
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        producer_id=pid,
        producer_epoch=epoch,
    )
