"""What every API handler shares: the registry, the broker context, response building.

A handler is `async def handle(ctx, head, request) -> response | Later | NO_RESPONSE`, typed
with its API's request and response unions from broker/handlers/apitypes.py (kio's schema
classes of the versions it serves). Its body up to the return runs in the connection's request
order (so produce appends keep the producer's order); returning `Later(coroutine)` lets the
slow part (long-poll fetches) overlap with the next requests, while responses still leave in
request order. `Later(when_done(futures, timeout, finish))` does the same without a coroutine
or a task: produce answers so, once its appends are durable (one callback per append).

Response classes differ by version, so `build` drops the values a version has no field for;
a value named after no field of that class in any served version is a programming error and
raises `UnknownFieldError`, as does `nested` for a class name no served version has.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeAlias, TypeVar, cast

from kio.index import load_entity_module
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from broker.config import Settings
from broker.engine import StorageEngine
from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import OffsetStore
from broker.metadata.tablework import TableWork
from broker.protocol.codec import RequestHead, response_type
from broker.schemavalidation import SchemaValidator
from broker.txn.coordinator import TxnCoordinator

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ZERO_MS = datetime.timedelta(0)

Rq = TypeVar("Rq")
Rs = TypeVar("Rs")
T = TypeVar("T", bound="DataclassInstance")
Kind: TypeAlias = Literal[EntityType.request, EntityType.response]
Entity: TypeAlias = "DataclassInstance"  # a nested schema object (`build(nested(...), ...)`)


class UnknownFieldError(TypeError):
    """A response value or class named after nothing in any served version of the API."""


class Later(Generic[Rs]):
    """A response that will be ready when the coroutine finishes, or the future is done."""

    __slots__ = ("coro",)

    def __init__(self, coro: Coroutine[object, object, Rs] | asyncio.Future[Rs]) -> None:
        self.coro = coro


def when_done(
    futures: Sequence[asyncio.Future[Any]], timeout: float, finish: Callable[[], Rs]
) -> asyncio.Future[Rs]:
    """A future of `finish()`, called once: when every one of `futures` is done, or when
    `timeout` seconds have passed (finish then sees some not done). What asyncio.wait and a
    task per response did, with a callback per future and one timer. An exception from
    `finish` becomes the future's."""
    return _WhenDone(futures, timeout, finish).out


class _WhenDone(Generic[Rs]):
    """when_done's state. Not closures: two closures calling each other are a reference
    cycle, which only the cyclic GC frees (~27 objects per Produce, measured: its
    collections then cost more than the request). References the other way (a future's
    callback, the timer) are dropped when it settles."""

    __slots__ = ("finish", "left", "out", "timer", "waiting")

    def __init__(
        self, futures: Sequence[asyncio.Future[Any]], timeout: float, finish: Callable[[], Rs]
    ) -> None:
        loop = asyncio.get_running_loop()
        self.out: asyncio.Future[Rs] = loop.create_future()
        self.finish: Callable[[], Rs] | None = finish
        self.waiting = [f for f in futures if not f.done()]
        self.left = len(self.waiting)
        self.timer: asyncio.TimerHandle | None = None
        if not self.waiting:
            self.settle()
            return
        self.timer = loop.call_later(timeout, self.settle)
        for f in self.waiting:
            f.add_done_callback(self.one_done)

    def one_done(self, _: object) -> None:
        self.left -= 1
        if self.left == 0:
            self.settle()

    def settle(self) -> None:
        finish, self.finish = self.finish, None
        if finish is None:  # settled already
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.left:  # the timeout: the rest will not call back
            for f in self.waiting:
                f.remove_done_callback(self.one_done)
        self.waiting = []
        if self.out.done():  # cancelled by its reader
            return
        try:
            self.out.set_result(finish())
        except Exception as e:
            self.out.set_exception(e)


class _NoResponse(enum.Enum):
    token = 0


NO_RESPONSE: Final = _NoResponse.token  # Produce with acks=0: Kafka sends nothing back
NoResponse: TypeAlias = Literal[_NoResponse.token]
Reply: TypeAlias = Rs | Later[Rs] | NoResponse


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
    txn: TxnCoordinator | None = None  # the transaction coordinator (None: no transactions)
    # table topics' progress, for their read-only consumer groups (broker.metadata.tablework)
    table_work: TableWork | None = None

    @property
    def max_wait_cap_s(self) -> float:
        return self.settings.fetch_max_wait_cap_ms / 1000


class ApiTypes(Generic[Rq, Rs]):
    """An API key with its request and response types (unions over the served versions)."""

    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key


TypedHandler: TypeAlias = Callable[[BrokerContext, RequestHead, Rq], Awaitable[Reply[Rs]]]
Handler: TypeAlias = Callable[[BrokerContext, RequestHead, object], Awaitable[object]]


@dataclass(frozen=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handle: Handler


REGISTRY: dict[int, Api] = {}


def api(
    types: ApiTypes[Rq, Rs], min_version: int, max_version: int
) -> Callable[[TypedHandler[Rq, Rs]], TypedHandler[Rq, Rs]]:
    """Register the handler of `types.key` for versions min_version..max_version."""

    def register(fn: TypedHandler[Rq, Rs]) -> TypedHandler[Rq, Rs]:
        # The one place a request's type is taken on trust: decode_request hands the handler
        # of key K, for a version v in its range, an instance of kio's request class of (K, v),
        # and tests/unit/test_apitypes.py checks that Rq is exactly the union of those classes.
        REGISTRY[types.key] = Api(types.key, min_version, max_version, cast(Handler, fn))
        return fn

    return register


def _served_versions(api_key: int) -> range:
    registered = REGISTRY.get(api_key)
    if registered is not None:
        return range(registered.min_version, registered.max_version + 1)
    known = schema_name_map[api_key_map[api_key]]
    return range(min(known), max(known) + 1)


_KEYS = {name: key for key, name in api_key_map.items()}


def _place(cls: type) -> tuple[int, int, Kind]:
    """(api key, version, request or response) of a kio schema class, from its module's
    path: kio.schema.<api>.v<version>.<request|response>."""
    parts = cls.__module__.split(".")
    if len(parts) != 5 or parts[:2] != ["kio", "schema"] or parts[2] not in _KEYS:
        raise UnknownFieldError(f"{cls.__qualname__} is not a kio schema class")
    kind: Kind = EntityType.request if parts[4] == "request" else EntityType.response
    return _KEYS[parts[2]], int(parts[3].removeprefix("v")), kind


def _classes(api_key: int, kind: Kind, name: str) -> list[type[DataclassInstance]]:
    """The class called `name` in the schema module of every served version that has it."""
    out = []
    for v in _served_versions(api_key):
        cls = getattr(load_entity_module(api_key_map[api_key], v, kind), name, None)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            out.append(cls)
    return out


@cache
def _fields(cls: type[DataclassInstance]) -> tuple[frozenset[str], frozenset[str]]:
    """(this class's field names, the field names of its namesakes in every served version)."""
    own = frozenset(f.name for f in dataclasses.fields(cls))
    api_key, _version, kind = _place(cls)
    everywhere = set(own)
    for other in _classes(api_key, kind, cls.__name__):
        everywhere.update(f.name for f in dataclasses.fields(other))
    return own, frozenset(everywhere)


def build(cls: type[T], **values: object) -> T:
    """Instantiate a schema class with the values its version has fields for (the others
    are dropped); a value no served version of the class has a field for raises."""
    own, everywhere = _fields(cls)
    if values.keys() <= own:  # the common case: every value has its field here
        return cls(**values)
    if not values.keys() <= everywhere:
        unknown = ", ".join(sorted(values.keys() - everywhere))
        raise UnknownFieldError(f"{cls.__name__} has no field {unknown} in any served version")
    return cls(**{k: v for k, v in values.items() if k in own})


@cache
def _response_classes(api_key: int, name: str) -> dict[int, type[DataclassInstance]]:
    found = {_place(cls)[1]: cls for cls in _classes(api_key, EntityType.response, name)}
    if not found:
        raise UnknownFieldError(
            f"no served version of api {api_key}'s response has a class {name!r}"
        )
    return found


def schema_class(api_key: int, version: int, name: str) -> type[DataclassInstance]:
    """A nested class of an API's response schema at a version, e.g. 'MetadataResponseTopic'."""
    found = nested_class_or_none(api_key, version, name)
    if found is None:
        raise UnknownFieldError(f"api {api_key} v{version}'s response has no class {name!r}")
    return found


def nested_class_or_none(api_key: int, version: int, name: str) -> type[DataclassInstance] | None:
    """The class, or None at a version without it (a name no served version has raises)."""
    return _response_classes(api_key, name).get(version)


def response_class(types: ApiTypes[Rq, Rs], version: int) -> type[Rs]:
    # kio's loader is untyped (type[Any]); Rs is the union of exactly these classes over the
    # served versions, which tests/unit/test_apitypes.py checks
    cls: type[Rs] = response_type(types.key, version)
    return cls


def resp(head: RequestHead, types: ApiTypes[Rq, Rs]) -> type[Rs]:
    """The response class of the request's version."""
    if head.api_key != types.key:
        raise UnknownFieldError(f"api {head.api_key} answered with api {types.key}'s response")
    return response_class(types, head.api_version)


def nested(head: RequestHead, name: str) -> type[DataclassInstance]:
    return schema_class(head.api_key, head.api_version, name)


def nested_or_none(head: RequestHead, name: str) -> type[DataclassInstance] | None:
    return nested_class_or_none(head.api_key, head.api_version, name)
