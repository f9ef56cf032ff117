"""Schema validation at produce: Confluent's data-quality gate.

Topic configs `confluent.value.schema.validation` / `confluent.key.schema.validation` (boolean,
default false). With one on, every record of a produced record set must carry, in that part
(value or key), Confluent's wire format: magic byte 0, then a 4-byte big-endian schema id, then
the payload (Protobuf message indexes follow the id; only the id is checked, not the payload).
The id must be one of the live versions of the subject `<topic>-value` / `<topic>-key`
(Confluent's default TopicNameStrategy; `confluent.*.subject.name.strategy` accepts only it).

- A null value (tombstone) passes value validation, as in Confluent; a null key fails key
  validation (it carries no schema id).
- Too short, a wrong magic byte, an unknown id, or an id that no live version of the subject
  holds: INVALID_RECORD, naming the record (its index in the partition's record set, also in
  the response's record_errors) and why; nothing of that partition's record set is appended.
- Soft-deleted versions do not count: a soft delete retires a version from new writes, while
  consumers can still read records written under it by id (`/schemas/ids/{id}` serves it).
- Registry off (`--schema-registry ''`) with validation on: every produce to the topic fails
  with INVALID_RECORD "schema validation is on but no registry". Setting the configs is not
  refused, because a topic's configs outlive a broker start (a broker restarted without its
  registry must fail closed, not accept unchecked records).
- The registry's store failing during a lookup, or an external registry
  (`schema.registry.url`) unreachable: KAFKA_STORAGE_ERROR (retriable), nothing appended.

Where and why asynchronously: the registry lives in the metadata store (I/O), while
`StorageEngine.append` is synchronous so that calls made in order get offsets in that order.
The produce handler therefore awaits `SchemaValidator.check` for a partition BEFORE calling
append for it. net.py runs one request of a connection at a time, so awaiting inside the
handler before that request's append keeps per-connection order; a record set whose id is not
in the cache is decided exactly (the cache is reloaded from the registry), never answered with
a retriable error. Appends that do not come from Produce (table topics' dead-letter queue) are
not checked.

Cache: per subject, the set of ids of its live versions, loaded from the registry. An id in a
set loaded less than `ttl_s` (5 s) ago passes without I/O; any other id reloads the subject.
So a version soft- or hard-deleted may still be accepted for up to 5 s after the delete (the
window); a newly registered version is accepted at once.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from broker.config import TopicConfig
from broker.errors import ErrorCode, KafkaError
from broker.protocol import records
from broker.protocol.recordcodec import decode_raw
from broker.protocol.records import Buffer
from broker.schemaregistry.errors import RegistryError
from broker.schemaregistry.registry import SubjectVersion

MAGIC = 0
HEADER = 5  # magic byte + 4-byte schema id
TTL_S = 5.0
NO_REGISTRY = "schema validation is on but no registry"



class WireFormatError(ValueError):
    """Bytes that are not in Confluent's wire format."""


def schema_id(data: bytes | memoryview) -> int:
    """The schema id of a serialized key or value: byte 0 must be the magic byte 0 and four
    big-endian bytes of id follow. Raises WireFormatError otherwise."""
    if len(data) < HEADER:
        raise WireFormatError(f"{len(data)} bytes, too short for the magic byte and schema id")
    if data[0] != MAGIC:
        raise WireFormatError(f"magic byte {data[0]}, not {MAGIC}")
    (sid,) = struct.unpack_from(">i", data, 1)
    return int(sid)


def subject_for(topic: str, is_key: bool) -> str:
    """Confluent's TopicNameStrategy: `<topic>-key` or `<topic>-value`."""
    return f"{topic}-{'key' if is_key else 'value'}"


class RegistryReader(Protocol):
    """What validation reads: the built-in SchemaRegistry or an external one
    (broker.schemaregistry.external). A RegistryError is a verdict (no such subject, id); any
    other exception means the registry is unavailable (retriable)."""

    async def versions(self, subject: str) -> list[int]: ...
    async def get_version(self, subject: str, version: str) -> SubjectVersion: ...
    async def get_by_id(self, schema_id: int) -> object: ...


class InvalidRecords(KafkaError):
    """INVALID_RECORD for a record set, with (record index, why) for the response's
    record_errors."""

    def __init__(self, message: str, record_errors: list[tuple[int, str]]) -> None:
        super().__init__(ErrorCode.invalid_record, message)
        self.record_errors = record_errors


@dataclass
class _Entry:
    ids: frozenset[int]
    loaded_at: float


class SubjectIdCache:
    """Ids of each subject's live versions, loaded through `load` (subject -> ids, empty for an
    unknown subject). `contains` answers from a set loaded less than `ttl_s` ago when the id
    is in it, and otherwise reloads the subject first, so a negative answer is always fresh."""

    def __init__(
        self,
        load: Callable[[str], Awaitable[frozenset[int]]],
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self.loads = 0  # how many times the registry was asked (for tests and metrics)

    async def contains(self, subject: str, schema_id: int) -> bool:
        e = self._entries.get(subject)
        if e is not None and schema_id in e.ids and self._clock() - e.loaded_at < self._ttl_s:
            return True
        self.loads += 1
        ids = await self._load(subject)
        self._entries[subject] = _Entry(ids, self._clock())
        return schema_id in ids

    def invalidate(self, subject: str | None = None) -> None:
        """Forget one subject (or all): its next check reloads."""
        if subject is None:
            self._entries.clear()
        else:
            self._entries.pop(subject, None)


class SchemaValidator:
    """The gate the produce handler awaits before appending a partition's record set. Its
    registry is attached once started (`attach`, None when off); checks wait until then."""

    def __init__(self) -> None:
        self._registry: RegistryReader | None = None
        self._attached = asyncio.Event()
        self.cache = SubjectIdCache(self._live_ids)

    def attach(self, registry: RegistryReader | None) -> None:
        self._registry = registry
        self.cache.invalidate()
        self._attached.set()

    async def _live_ids(self, subject: str) -> frozenset[int]:
        assert self._registry is not None
        try:
            versions = await self._registry.versions(subject)
        except RegistryError:  # no live version
            return frozenset()
        ids = set()
        for v in versions:
            try:
                ids.add((await self._registry.get_version(subject, str(v))).schema.id)
            except RegistryError:  # deleted meanwhile
                continue
        return frozenset(ids)

    async def _why_not(self, sid: int, subject: str) -> str:
        assert self._registry is not None
        try:
            await self._registry.get_by_id(sid)
        except RegistryError:
            return f"unknown schema id {sid}"
        return f"schema id {sid} is not registered under subject {subject!r}"

    async def check(self, topic: str, data: Buffer | None, config: TopicConfig) -> None:
        """Raise InvalidRecords (INVALID_RECORD) if the topic validates keys or values and a
        record of `data` fails; return otherwise. Record sets that do not parse are left for
        append to reject with its own error."""
        parts = [is_key for is_key, on in ((False, config.value_schema_validation),
                                            (True, config.key_schema_validation)) if on]
        if not parts or not data:
            return
        try:
            batches = records.validate(data)
            recs = [r for h in batches if not h.is_control for r in decode_raw(data, h)]
        except Exception:  # corrupt or unsupported: append answers that
            return
        await self._attached.wait()
        if self._registry is None:
            raise InvalidRecords(NO_REGISTRY, [(0, NO_REGISTRY)])
        for index, r in enumerate(recs):
            for is_key in parts:
                what = "key" if is_key else "value"
                payload = r.key if is_key else r.value
                subject = subject_for(topic, is_key)
                if payload is None:
                    if not is_key:
                        continue  # tombstone
                    why = "null key has no schema id"
                else:
                    try:
                        sid = schema_id(payload)
                    except WireFormatError as e:
                        why = str(e)
                    else:
                        try:
                            if await self.cache.contains(subject, sid):
                                continue
                            why = await self._why_not(sid, subject)
                        except Exception as e:  # the metadata store: retriable, not a verdict
                            raise KafkaError(
                                ErrorCode.kafka_storage_error,
                                f"schema registry unavailable: {e!r}",
                            ) from None
                msg = f"record {index}: {what} fails schema validation: {why}"
                raise InvalidRecords(msg, [(index, msg)])
