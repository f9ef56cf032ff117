"""The metadata store: streams, objects and the chunk index (nothing of Kafka: topics,
partitions, producer and group state are broker.metadata's tables, in the same database).

One store (`MetadataStore`, in .store with its mixin .maintenance, plumbing in .base)
runs on either backend, chosen by URL with `open_metadata_store`:
- `sqlite:///path/meta.db` (embedded; `sqlite:////abs/path` for an absolute path),
- `postgresql://user:password@host:port/database` (shared by brokers; psycopg 3).
The backends differ only in what .backend describes (a dialect and a connection).
Connection loss and what a failed call means: see .base.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from s3stream.metadata.backend import Backend, redact_url
from s3stream.metadata.migrations import SchemaTooNewError
from s3stream.metadata.model import (
    ChunkRow,
    CommitAttachment,
    CommitInDoubtError,
    MetadataError,
    MetadataUnavailableError,
    ObjectCommit,
    ObjectRow,
    OffsetConflictError,
    StreamRow,
    StreamsFencedError,
    TransactionRetryError,
)
from s3stream.metadata.store import MetadataStore

# The old name, kept for existing imports and annotations: SqliteMetadataStore(path) opens
# SQLite at path, and the type covers stores on every backend.
SqliteMetadataStore = MetadataStore

__all__ = [
    "ChunkRow",
    "CommitAttachment",
    "CommitInDoubtError",
    "MetadataError",
    "MetadataStore",
    "MetadataUnavailableError",
    "ObjectCommit",
    "ObjectRow",
    "OffsetConflictError",
    "SchemaTooNewError",
    "SqliteMetadataStore",
    "StreamRow",
    "StreamsFencedError",
    "TransactionRetryError",
    "open_metadata_store",
    "redact_url",
]


def open_metadata_store(url: str) -> MetadataStore:
    """A store for `sqlite:///PATH` or `postgresql://user:password@host:port/database`
    (`postgres://` too). Nothing connects until `open()`."""
    parsed = urlparse(url)
    backend: Backend
    if parsed.scheme == "sqlite":
        # sqlite:///relative/or/absolute -> path after the third slash (absolute with four)
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else parsed.path
        return MetadataStore(Path(path))
    if parsed.scheme in ("postgresql", "postgres"):
        from s3stream.metadata.postgres import PostgresBackend  # psycopg only when used

        backend = PostgresBackend(url)
        return MetadataStore(backend)
    raise ValueError(
        f"unsupported metadata URL {redact_url(url)!r}"
        " (use sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE)"
    )
