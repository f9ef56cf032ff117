"""What every API handler shares: the registry, the broker context, response building.

A handler is `async def handle(ctx, head, request) -> response | Later`. Its body up to the
return runs in the connection's request order (so produce appends keep the producer's order);
returning `Later(coroutine)` lets the slow part (waiting for durability, long-poll fetches)
overlap with the next requests, while responses still leave in request order.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import cache
from typing import Any

from broker.config import Settings
from broker.engine import StorageEngine
from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import OffsetStore
from broker.protocol.codec import RequestHead, response_type
from broker.schemavalidation import SchemaValidator

ZERO_MS = datetime.timedelta(0)


class Later:
    """A response that will be ready when the coroutine finishes."""

    __slots__ = ("coro",)

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro


@dataclass
class BrokerContext:
    storage: StorageEngine
    settings: Settings
    node_id: int
    host: str  # advertised
    port: int
    groups: GroupCoordinator
    offsets: OffsetStore
    schemas: SchemaValidator | None = None  # produce's schema validation (None: never checks)

    @property
    def max_wait_cap_s(self) -> float:
        return float(self.settings["fetch.max.wait.cap.ms"]) / 1000


Handler = Callable[[BrokerContext, RequestHead, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handle: Handler


REGISTRY: dict[int, Api] = {}


def api(key: int, min_version: int, max_version: int) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        REGISTRY[key] = Api(key, min_version, max_version, fn)
        return fn

    return register


@cache
def _field_names(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def build(cls: Any, **values: Any) -> Any:
    """Instantiate a schema class with the values its version has (others are dropped)."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def has_field(cls: Any, name: str) -> bool:
    return name in _field_names(cls)


@cache
def schema_class(api_key: int, version: int, name: str) -> type[Any]:
    """A nested class of an API's response schema at a version, e.g. 'MetadataResponseTopic'."""
    mod = sys.modules[response_type(api_key, version).__module__]
    cls = getattr(mod, name)
    assert isinstance(cls, type)
    return cls


def resp(head: RequestHead) -> type[Any]:
    return response_type(head.api_key, head.api_version)


def nested(head: RequestHead, name: str) -> type[Any]:
    return schema_class(head.api_key, head.api_version, name)
