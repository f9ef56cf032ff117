"""Starting the registry from broker settings (`schema.registry` = HOST:PORT, '' = off)."""

from __future__ import annotations

import asyncio
import logging

from broker.config import Settings
from broker.schemaregistry.http import serve_registry
from broker.schemaregistry.registry import SchemaRegistry
from s3stream.metadata import MetadataStore

log = logging.getLogger("floe.schemaregistry")


async def start_schema_registry(
    settings: Settings, meta: MetadataStore
) -> tuple[SchemaRegistry | None, asyncio.Server | None]:
    """Create the registry's tables (migrations) and serve it; prints `schema registry on
    HOST:PORT`. A port that cannot be bound is logged as an ERROR and the broker runs without
    the HTTP server (the in-process registry still works). Off when the setting is empty."""
    if settings.schema_registry is None:
        return None, None
    registry = SchemaRegistry(meta)
    await registry.open()
    host, port = settings.schema_registry
    try:
        server = await serve_registry(registry, host, port)
    except OSError as e:
        log.error("schema registry %s not served: %s", settings.values["schema.registry"], e)
        return registry, None
    shost, sport = server.sockets[0].getsockname()[:2]
    print(f"schema registry on {shost}:{sport}", flush=True)
    return registry, server
