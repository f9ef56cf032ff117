"""Dead letters: records that cannot become table rows go to a Kafka topic, never nowhere.

Each dead letter keeps the original key, value and headers and adds `floe.error.*` and
`floe.source.*` headers. Writing is idempotent across restarts: the highest source offset
already in the DLQ topic is read back per source partition, and anything at or below it is
not written again.
"""

from __future__ import annotations

from broker.engine import StorageEngine
from broker.errors import ErrorCode, KafkaError
from broker.protocol import records
from broker.protocol.recordcodec import decode_records, encode_batch
from tabletopic.convert import Invalid

SOURCE_PARTITION = "floe.source.partition"
SOURCE_OFFSET = "floe.source.offset"


class DeadLetters:
    def __init__(self, storage: StorageEngine, topic: str, source_topic: str) -> None:
        self.storage = storage
        self.topic = topic
        self.source_topic = source_topic
        self.written: dict[int, int] | None = None  # source partition -> highest source offset
        self.count = 0  # dead letters of source_topic in the DLQ topic (after load / a write)

    async def load(self) -> None:
        """Read what the DLQ topic already holds for source_topic (if it exists yet), so that
        `count` is the topic's whole dead-letter count, not this run's."""
        if self.written is None and self.topic in self.storage.topics:
            self.written = await self._scan()

    async def _ensure(self) -> None:
        if self.topic not in self.storage.topics:
            try:
                await self.storage.create_topic(self.topic, 1, {})
            except KafkaError as e:
                if e.code != ErrorCode.topic_already_exists:
                    raise
        if self.written is None:
            self.written = await self._scan()

    async def _scan(self) -> dict[int, int]:
        seen: dict[int, int] = {}
        self.count = 0
        start, end = self.storage.offsets(self.topic, 0)
        offset = start
        while offset < end:
            data = await self.storage.read(self.topic, 0, offset, 4 << 20, must_return_one=True)
            if not data:
                break
            for h in records.iter_headers(data):
                for r in decode_records(data, h):
                    hs = dict(r.headers)
                    if hs.get("floe.source.topic") == self.source_topic.encode():
                        p = int(hs[SOURCE_PARTITION] or b"-1")
                        seen[p] = max(seen.get(p, -1), int(hs[SOURCE_OFFSET] or b"-1"))
                        self.count += 1
                offset = h.next_offset
        return seen

    async def write(self, partition: int, dead: list[Invalid]) -> int:
        """Append the dead letters of one source partition (durably); returns how many were
        new."""
        await self._ensure()
        assert self.written is not None
        high = self.written.get(partition, -1)
        fresh = [d for d in dead if d.record.offset > high]
        if not fresh:
            return 0
        batch = encode_batch(
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
        await self.storage.append(self.topic, 0, batch)
        self.written[partition] = fresh[-1].record.offset
        self.count += len(fresh)
        return len(fresh)
