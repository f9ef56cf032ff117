"""An external Confluent-compatible Schema Registry (`schema.registry.url`), read over HTTP.

With `schema.registry.url` set, produce validation (broker.schemavalidation) and table
conversion (tabletopic.schemaconvert's `SchemaById`) read schemas from that registry instead of
the built-in one, through the same calls: `get_by_id`, `versions`, `get_version` (references are
read with `get_version`). Requests go through urllib in a worker thread, each bounded by
`TIMEOUT_S`.

Errors: an answer with a Confluent `error_code` in the 4xx range (40401 no subject, 40402 no
version, 40403 no schema id, ...) raises `RegistryError` with that code, as the built-in
registry does, so an unknown id is INVALID_RECORD at produce and an invalid record for the
table writer. Anything else (connection refused, a timeout, a 5xx, an answer that is not
Confluent's JSON) raises `RegistryUnavailable`: produce answers KAFKA_STORAGE_ERROR
(retriable, nothing appended) and the table writer retries; nothing is dropped. The last such
error, with its time, is kept for /status (`last_error`), and `probe` (GET /subjects) is the
health check.

Cache: schemas by id are immutable in a Confluent registry, so each id is fetched once. Subject
versions are not cached here (the validator keeps its own 5 s cache of a subject's ids; the
table writer reads `latest` once per pass).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from broker.config.settings import check_registry_url
from broker.schemaregistry.errors import RegistryError
from broker.schemaregistry.registry import SubjectVersion
from broker.schemaregistry.store import Reference, StoredSchema

TIMEOUT_S = 5.0
MAX_BODY = 16 * 1024 * 1024


class RegistryUnavailable(Exception):
    """The external registry did not answer usably (retriable: not a verdict on a record)."""


def _stored(schema_id: int, d: dict[str, Any]) -> StoredSchema:
    refs = tuple(Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
                 for r in d.get("references") or ())
    return StoredSchema(schema_id, str(d.get("schemaType") or "AVRO"), str(d["schema"]), refs)


class ExternalRegistry:
    """The reading half of the registry API over an external registry (see the module doc)."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.url = check_registry_url(url)
        self.timeout_s = timeout_s
        self._by_id: dict[int, StoredSchema] = {}
        self.requests = 0  # HTTP requests made (tests, metrics)
        self._last_error = ("", 0.0)

    def last_error(self) -> tuple[str, float]:
        """The last error that made a request fail as unavailable, and when (wall clock)."""
        return self._last_error

    def _get_sync(self, path: str) -> Any:
        req = urllib.request.Request(
            self.url + path, headers={"Accept": "application/vnd.schemaregistry.v1+json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read(MAX_BODY))
        except urllib.error.HTTPError as e:
            try:
                body = json.loads(e.read(MAX_BODY))
                code, msg = int(body["error_code"]), str(body.get("message", ""))
            except Exception:
                code, msg = 0, f"HTTP {e.code} {e.reason}"
            if 400 <= e.code < 500 and code:
                raise RegistryError(e.code, code, msg) from None
            raise RegistryUnavailable(f"{self.url}{path}: HTTP {e.code}: {msg}") from None
        except (OSError, ValueError) as e:  # refused, timeout, reset, not JSON
            raise RegistryUnavailable(f"{self.url}: {type(e).__name__}: {e}") from None

    async def _get(self, path: str) -> Any:
        self.requests += 1
        try:
            return await asyncio.to_thread(self._get_sync, path)
        except RegistryUnavailable as e:
            self._last_error = (str(e)[:500], time.time())
            raise

    async def probe(self) -> None:
        """Health check: the registry answers GET /subjects."""
        await self._get("/subjects")

    async def get_by_id(self, schema_id: int) -> StoredSchema:
        """The schema with this id (cached: ids are immutable); RegistryError 40403 if
        unknown."""
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        d = await self._get(f"/schemas/ids/{int(schema_id)}")
        try:
            s = _stored(schema_id, d)
        except (KeyError, TypeError, ValueError) as e:
            raise RegistryUnavailable(f"schema id {schema_id}: unexpected answer: {e!r}") from None
        self._by_id[schema_id] = s
        return s

    async def versions(self, subject: str) -> list[int]:
        """The live versions of a subject; RegistryError 40401 if it has none."""
        d = await self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions")
        if not isinstance(d, list):
            raise RegistryUnavailable(f"versions of {subject!r}: unexpected answer {d!r}")
        return [int(v) for v in d]

    async def get_version(self, subject: str, version: str) -> SubjectVersion:
        """One version of a subject (`latest` too); 40401 / 40402 if absent."""
        q = urllib.parse.quote(subject, safe="")
        d = await self._get(f"/subjects/{q}/versions/{urllib.parse.quote(str(version))}")
        try:
            sid = int(d["id"])
            s = _stored(sid, d)
            return SubjectVersion(str(d.get("subject", subject)), int(d["version"]), s)
        except (KeyError, TypeError, ValueError) as e:
            raise RegistryUnavailable(f"{subject} v{version}: unexpected answer: {e!r}") from None
