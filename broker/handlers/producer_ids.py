"""InitProducerId (22): ids for idempotent producers, and for transactional ones from the
transaction coordinator (an epoch bump that fences the earlier producer of the same
transactional.id and aborts its open transaction)."""

from __future__ import annotations

from kio.schema.init_producer_id.v0.request import InitProducerIdRequest as InitProducerIdV0
from kio.schema.init_producer_id.v1.request import InitProducerIdRequest as InitProducerIdV1
from kio.schema.init_producer_id.v2.request import InitProducerIdRequest as InitProducerIdV2

from broker.errors import ErrorCode, KafkaError
from broker.handlers.apitypes import INIT_PRODUCER_ID, InitProducerIdRequest, InitProducerIdResponse
from broker.handlers.base import ZERO_MS, BrokerContext, api, build, resp
from broker.handlers.txn import coordinator, fenced_code
from broker.protocol.codec import RequestHead


@api(INIT_PRODUCER_ID, 0, 4)
async def init_producer_id(
    ctx: BrokerContext, head: RequestHead, req: InitProducerIdRequest
) -> InitProducerIdResponse:
    if req.transactional_id is not None:
        given = (  # KIP-360 (v3+): the producer's current id and epoch, to bump
            (-1, -1)
            if isinstance(req, InitProducerIdV0 | InitProducerIdV1 | InitProducerIdV2)
            else (req.producer_id, req.producer_epoch)
        )
        code, pid, epoch = ErrorCode.none, -1, -1
        try:
            pid, epoch = await coordinator(ctx).init_producer_id(
                req.transactional_id,
                int(req.transaction_timeout.total_seconds() * 1000),
                *given,
            )
        except KafkaError as e:
            code = fenced_code(e.code, head, 4)
        return build(
            resp(head, INIT_PRODUCER_ID),
            throttle_time=ZERO_MS,
            error_code=code,
            producer_id=pid,
            producer_epoch=epoch,
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
