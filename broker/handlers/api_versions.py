"""ApiVersions (18): the answer is built from what is registered."""

from __future__ import annotations

from typing import Any

from broker.errors import ErrorCode
from broker.handlers.base import REGISTRY, ZERO_MS, BrokerContext, api, build, schema_class
from broker.protocol.codec import RequestHead, response_type


def api_versions_response(api_version: int, error: ErrorCode = ErrorCode.none) -> Any:
    entry = schema_class(18, api_version, "ApiVersion")
    keys = tuple(
        entry(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(REGISTRY.values(), key=lambda a: a.key)
    )
    return build(
        response_type(18, api_version), error_code=error, api_keys=keys, throttle_time=ZERO_MS
    )


@api(18, 0, 4)
async def handle(ctx: BrokerContext, head: RequestHead, req: Any) -> Any:
    return api_versions_response(head.api_version)
