"""Dead letters: records that cannot become table rows go to a Kafka topic, never nowhere.

Each dead letter keeps the original key, value and headers and adds `floe.error.*` and
`floe.source.*` headers. Writing is idempotent across restarts and brokers: the highest source
offset already in the DLQ topic is read back per source partition, and anything at or below it
is not written again.

The DLQ topic's one partition may be led by another broker of the cluster than the one writing
(each source partition's worker runs on that partition's leader): `PartitionLog`
(tabletopic/remotelog.py) reads and appends it locally or over the Kafka protocol. Before each
write, what was appended to the DLQ since it was last read (by another broker's worker, this
broker's own write whose outcome was unknown, a worker that led the source partition while
this one did not) is read, so that `written` is what the DLQ holds and no source offset is
written twice.
"""

from __future__ import annotations

from broker.engine import StorageEngine
from broker.errors import ErrorCode, KafkaError
from broker.protocol.recordcodec import Record, encode_batch
from tabletopic.convert import Invalid
from tabletopic.remotelog import PartitionLog, moved

SOURCE_PARTITION = "floe.source.partition"
SOURCE_OFFSET = "floe.source.offset"
WRITE_ATTEMPTS = 5  # appends of one write while the DLQ partition's leader moves


def _int(header: bytes | None) -> int:
    """A floe.source.* number (-1 if it is none: the DLQ topic is anyone's to produce to)."""
    try:
        return int(header or b"-1")
    except ValueError:
        return -1


class DeadLetters:
    def __init__(self, storage: StorageEngine, topic: str, source_topic: str) -> None:
        self.storage = storage
        self.topic = topic
        self.source_topic = source_topic
        self.log = PartitionLog(storage, topic, 0)
        # source partition -> highest source offset in the DLQ; None: not read yet
        self.written: dict[int, int] | None = None
        self.count = 0  # dead letters of source_topic in the DLQ topic (after load / a write)
        self.end = 0  # the DLQ offset up to which `written` and `count` were read
        self._mine: list[range] = []  # our own appends at or above `end` (already counted)

    async def load(self) -> None:
        """Read what the DLQ topic already holds for source_topic (if it exists yet), so that
        `count` is the topic's whole dead-letter count, not this run's."""
        if self.written is None and self.topic in self.storage.topics:
            await self._catch_up()

    async def _ensure(self) -> dict[int, int]:
        if self.topic not in self.storage.topics:
            try:
                await self.storage.create_topic(self.topic, 1, {})
            except KafkaError as e:
                if e.code != ErrorCode.topic_already_exists:
                    raise
        return await self._catch_up()

    async def _catch_up(self) -> dict[int, int]:
        """`written` and `count` as the DLQ holds them now: the whole log on first use (or if
        it lost what was read: retention, a recreated topic), else only what was appended
        since. Nothing changes unless all of it was read."""
        start, end = await self.log.offsets()
        whole = self.written is None or not start <= self.end <= end
        if not whole and self.end == end:
            assert self.written is not None
            return self.written
        seen = {} if whole or self.written is None else dict(self.written)
        count = 0 if whole else self.count
        mine = [] if whole else self._mine
        source = self.source_topic.encode()

        def visit(r: Record) -> None:
            nonlocal count
            hs = dict(r.headers)
            if hs.get("floe.source.topic") == source:
                p = _int(hs.get(SOURCE_PARTITION))
                seen[p] = max(seen.get(p, -1), _int(hs.get(SOURCE_OFFSET)))
                if not any(r.offset in m for m in mine):
                    count += 1

        await self.log.scan(visit, start if whole else self.end, end)
        self.written, self.count, self.end = seen, count, end
        self._mine = [m for m in mine if m.stop > end]
        return seen

    def _batch(self, partition: int, fresh: list[Invalid]) -> bytes:
        return encode_batch(
            [
                (
                    d.record.key,
                    d.record.value,
                    [
                        *d.record.headers,
                        ("floe.error.reason", d.reason.encode()),
                        ("floe.source.topic", self.source_topic.encode()),
                        (SOURCE_PARTITION, str(partition).encode()),
                        (SOURCE_OFFSET, str(d.record.offset).encode()),
                        ("floe.source.timestamp", str(d.record.timestamp).encode()),
                    ],
                )
                for d in fresh
            ]
        )

    async def write(self, partition: int, dead: list[Invalid]) -> int:
        """Append the dead letters of one source partition (durably, as one batch); returns
        how many were new. The DLQ partition's leader moving is followed (the DLQ is read
        again, then written); any other error is raised, retriable ones with their code."""
        written = await self._ensure()
        before = written.get(partition, -1)
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            high = written.get(partition, -1)
            fresh = [d for d in dead if d.record.offset > high]
            if not fresh:
                break
            view = self.storage.cluster_view()
            try:
                base = await self.log.append(self._batch(partition, fresh))
            except KafkaError as e:
                # the outcome may be unknown: the catch-up before the next append reads it
                if not moved(e) or attempt == WRITE_ATTEMPTS:
                    raise
                await self.log.next_view(view)
                written = await self._ensure()
                continue
            written[partition] = max(high, *(d.record.offset for d in fresh))
            self.count += len(fresh)
            if base == self.end:
                self.end = base + len(fresh)
            else:  # others appended in between: read them before the next write
                self._mine.append(range(base, base + len(fresh)))
            break
        return sum(1 for d in dead if before < d.record.offset <= written.get(partition, -1))
