"""What the metadata store hands out, takes and raises: row types, commit attachments, errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from s3stream.metadata.backend import Connection


class MetadataError(Exception):
    """A metadata operation failed and changed nothing. `retriable`: the same call may work
    if made again later (the database was unreachable), as opposed to a refusal."""

    retriable: ClassVar[bool] = False


class OffsetConflictError(MetadataError):
    """A commit's base offset is not the stream's end offset: someone else wrote, or a retry."""


class StreamsFencedError(MetadataError):
    """A guard (see CommitAttachment) refused a commit because the writer no longer owns some
    of its streams (another writer took them, e.g. a new partition leader): nothing was
    written. `stream_ids` are the streams refused; a commit of the others may be made again."""

    def __init__(self, stream_ids: set[int], message: str) -> None:
        super().__init__(message)
        self.stream_ids = frozenset(stream_ids)


class MetadataUnavailableError(MetadataError):
    """The database connection was lost or could not be made; the call did not take effect.
    The store reconnects on its next call."""

    retriable = True


class CommitInDoubtError(MetadataUnavailableError):
    """The connection was lost while COMMIT was on its way: the transaction may or may not
    have committed. The caller may treat it as not done: on reconnecting, the store asks the
    server and undoes what did commit, for the operations that say so in their docstring."""


class TransactionRetryError(MetadataError):
    """The database aborted a transaction to break a deadlock or a serialization conflict;
    the store runs it again a few times before letting this through."""

    retriable = True


@dataclass(frozen=True, slots=True)
class StreamRow:
    stream_id: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class ChunkRow:
    stream_id: int
    base_offset: int
    last_offset: int
    object_id: int
    position: int
    length: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class ObjectRow:
    object_id: int
    key: str
    size: int
    kind: str
    created_ms: int


@dataclass(frozen=True, slots=True)
class ObjectCommit:
    """One durable object to make part of its streams (`commit_objects`): its chunks, and
    what the layer above adds to its commit (see CommitAttachment)."""

    object_id: int
    key: str
    size: int
    chunks: list[ChunkRow]
    attachments: Sequence[CommitAttachment] = ()


class CommitAttachment(Protocol):
    """What the layer above adds to a `commit_object` transaction: guards (checks that raise
    to refuse the commit, e.g. a leader epoch or lease) and attachments (its own rows that
    must become durable exactly when the chunks do, e.g. producer state). s3stream does not
    interpret them; it runs them inside the commit's transaction, on the store's thread."""

    def apply(self, db: Connection, live: set[int]) -> None:
        """Inside the commit's transaction, after the chunks and end offsets are written;
        `live` are the committed streams that still exist. Raising aborts the commit (nothing
        of it is written) and the exception reaches commit_object's caller."""

    def undo(self, db: Connection, undone: list[ChunkRow]) -> None:
        """Inside the transaction that takes back a commit whose COMMIT was in doubt (see
        s3stream.metadata.base): reverse what `apply` wrote for the chunks in `undone`, the
        ones actually taken back (a stream written since keeps its commit)."""
