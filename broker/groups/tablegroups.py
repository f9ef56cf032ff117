"""Table topics as read-only consumer groups (issue 13): the table of a table topic appears as
the group `floe-table.<namespace>.<table>`, with no member, whose committed offsets are the
table's `floe.offsets` (the next Kafka offset per partition the Iceberg table holds), as the
table coordinator publishes them after each commit (broker.metadata.tablework, Progress). So
every consumer-lag tool (floe groups, kafka-consumer-groups, AdminClient, lag exporters) shows
how far the table is behind its topic.

The prefix is reserved whether or not such a table exists: no client may join, commit to,
delete or otherwise change a `floe-table.` group (`refuse`). The rows are read from the
metadata database on each request that asks about these groups (`read`): the table is small,
and any broker answers the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from broker.errors import ErrorCode, KafkaError
from broker.metadata.model import OffsetRow
from broker.metadata.tablework import Progress
from s3stream.metadata import MetadataError

PREFIX = "floe-table."

# The answer to any change of a table group. GROUP_AUTHORIZATION_FAILED is what Kafka answers
# when a client may not change a group (an ACL allowing Describe but not Read): the group is
# there to be read (ListGroups, DescribeGroups, OffsetFetch answer) but not changed, which is
# exactly this case. Every client treats it as fatal rather than retriable: the Java client
# throws GroupAuthorizationException from poll()/commitSync()/the admin futures,
# librdkafka hands the consumer an error event (JoinGroup failed: Broker: Group authorization
# failed) and fails the admin requests, kafka-python raises GroupAuthorizationFailedError.
# INVALID_GROUP_ID would be fatal too, but Kafka uses it for an empty or malformed id, and it
# would say the group does not exist while ListGroups lists it.
REFUSAL = ErrorCode.group_authorization_failed
# The metadata string ends with a NUL, as librdkafka's commits do (it sends C strings with
# their terminator): confluent-kafka-python (2.16) reads an OffsetFetch's metadata up to a NUL,
# so without one it returns bytes past the string (or fails decoding them); other clients
# show the NUL as a last character, as they do for any group a librdkafka client commits to.
C_STRING_END = "\x00"
EMPTY = "Empty"
PROTOCOL_TYPE = "consumer"


def is_table_group(group_id: str) -> bool:
    return group_id.startswith(PREFIX)


def group_id_of(table: str) -> str:
    """The group of the table `<namespace>.<table>`."""
    return PREFIX + table


def refuse(group_id: str) -> None:
    """Raise GROUP_AUTHORIZATION_FAILED for a change to a table group (a reserved id)."""
    if is_table_group(group_id):
        raise KafkaError(REFUSAL, f"group {group_id} is the read-only progress of an Iceberg"
                         " table (the prefix floe-table. is reserved)")


@dataclass(frozen=True)
class TableGroup:
    """One table's group: its topic and the table's next offset per partition."""

    group_id: str
    topic: str
    table: str
    offsets: Mapping[int, int]
    snapshot_id: int | None
    commit_ms: int

    @property
    def metadata(self) -> str:
        """The committed offsets' metadata string: where they come from."""
        at = "no snapshot" if self.snapshot_id is None else f"snapshot {self.snapshot_id}"
        return f"Iceberg table {self.table} at {at}"

    # the reads of broker.groups.offsets.OffsetStore that OffsetFetch makes
    def get(self, group_id: str, topic: str, partition: int) -> OffsetRow | None:
        offset = self.offsets.get(partition) if topic == self.topic else None
        if offset is None or group_id != self.group_id:
            return None
        return OffsetRow(group_id, topic, partition, offset, -1, self.metadata + C_STRING_END,
                         self.commit_ms)

    def of_group(self, group_id: str) -> dict[tuple[str, int], OffsetRow]:
        rows = (self.get(group_id, self.topic, p) for p in sorted(self.offsets))
        return {(r.topic, r.partition): r for r in rows if r is not None}


class NoOffsets:
    """The reads of a table group no table publishes (yet): an unknown group, no offsets."""

    def get(self, group_id: str, topic: str, partition: int) -> OffsetRow | None:
        return None

    def of_group(self, group_id: str) -> dict[tuple[str, int], OffsetRow]:
        return {}


class ProgressSource(Protocol):  # broker.metadata.tablework.TableWork
    async def progress(self) -> list[Progress]: ...


def groups_of(progress: Iterable[Progress]) -> dict[str, TableGroup]:
    """The table groups of the published progress rows, by group id."""
    out: dict[str, TableGroup] = {}
    for p in progress:
        gid = group_id_of(p.table)
        out.setdefault(gid, TableGroup(gid, p.topic, p.table, dict(p.offsets), p.snapshot_id,
                                       p.commit_ms))
    return out


async def read(work: ProgressSource | None) -> dict[str, TableGroup]:
    """Every table group, read now (once per request that needs them). A database that cannot
    be read answers COORDINATOR_NOT_AVAILABLE, which clients retry."""
    if work is None:  # an engine without table topics
        return {}
    try:
        return groups_of(await work.progress())
    except MetadataError as e:
        raise KafkaError(ErrorCode.coordinator_not_available,
                         f"table groups unreadable: {e}") from e


def listed(groups: Mapping[str, TableGroup]) -> dict[str, tuple[str, str]]:
    """ListGroups' (protocol type, state) of each table group."""
    return dict.fromkeys(groups, (PROTOCOL_TYPE, EMPTY))
