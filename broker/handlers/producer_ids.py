"""InitProducerId (22): ids for idempotent producers (transactions are not supported yet)."""

from __future__ import annotations

from kio.schema.init_producer_id.v0.request import InitProducerIdRequest as InitProducerIdV0
from kio.schema.init_producer_id.v1.request import InitProducerIdRequest as InitProducerIdV1
from kio.schema.init_producer_id.v2.request import InitProducerIdRequest as InitProducerIdV2

from broker.errors import ErrorCode
from broker.handlers.apitypes import INIT_PRODUCER_ID, InitProducerIdRequest, InitProducerIdResponse
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, resp
from broker.protocol.codec import RequestHead


@api(INIT_PRODUCER_ID, 0, 4)
async def init_producer_id(
    ctx: BrokerContext, head: RequestHead, req: InitProducerIdRequest
) -> InitProducerIdResponse:
    if req.transactional_id is not None:
        return build(
            resp(head, INIT_PRODUCER_ID),
            throttle_time=ZERO_MS,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    if isinstance(req, InitProducerIdV0 | InitProducerIdV1 | InitProducerIdV2):
        pid, epoch = await ctx.storage.init_producer_id(-1, -1)  # a new producer
    else:
        pid, epoch = await ctx.storage.init_producer_id(req.producer_id, req.producer_epoch)
    return build(
        resp(head, INIT_PRODUCER_ID),
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        producer_id=pid,
        producer_epoch=epoch,
    )
