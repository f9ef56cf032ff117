"""ApiVersions (18): the answer is built from what is registered."""

from __future__ import annotations

from broker.errors import ErrorCode
from broker.handlers.apitypes import API_VERSIONS, ApiVersionsRequest, ApiVersionsResponse
from broker.handlers.base import (
    REGISTRY,
    ZERO_MS,
    BrokerContext,
    api,
    build,
    response_class,
    schema_class,
)
from broker.protocol.codec import RequestHead


def api_versions_response(
    api_version: int, error: ErrorCode = ErrorCode.none
) -> ApiVersionsResponse:
    entry = schema_class(API_VERSIONS.key, api_version, "ApiVersion")
    keys = tuple(
        build(entry, api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(REGISTRY.values(), key=lambda a: a.key)
    )
    return build(
        response_class(API_VERSIONS, api_version),
        error_code=error,
        api_keys=keys,
        throttle_time=ZERO_MS,
    )


@api(API_VERSIONS, 0, 4)
async def handle(
    ctx: BrokerContext, head: RequestHead, req: ApiVersionsRequest
) -> ApiVersionsResponse:
    return api_versions_response(head.api_version)
