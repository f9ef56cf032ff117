"""A consumer-group member using aiokafka, in its own process, for tests that kill members.

    python -m tests.integration.group_member_aiokafka BOOTSTRAP GROUP TOPIC

The aiokafka twin of `group_member.py`, with the same stdout protocol: `ASSIGNED p,p,...` after
each rebalance, `REC partition offset value` for each processed record (after processing and
before its offset is committed: at-least-once), and a synchronous commit of the processed
offsets after each `getmany` batch (`COMMIT-FAILED error` when that commit is refused, e.g.
because a rebalance took a partition away). Runs until stdin is closed.
"""

from __future__ import annotations

import asyncio
import sys
import threading

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata


class PrintAssignment(ConsumerRebalanceListener):  # type: ignore[misc]
    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        print("ASSIGNED " + ",".join(str(p) for p in sorted(tp.partition for tp in assigned)),
              flush=True)


async def run() -> None:
    bootstrap, group, topic = sys.argv[1:4]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def wait_for_stdin_eof() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_stdin_eof, daemon=True).start()
    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
        session_timeout_ms=6000, heartbeat_interval_ms=500, auto_offset_reset="earliest")
    await c.start()
    try:
        c.subscribe([topic], listener=PrintAssignment())
        while not stop.is_set():
            batches = await c.getmany(timeout_ms=200, max_records=500)
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            for tp, records in batches.items():
                for r in records:
                    print(f"REC {r.partition} {r.offset} {r.value.decode()}", flush=True)
                if records:
                    offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "")
            if offsets:
                try:
                    await c.commit(offsets)
                except KafkaError as e:
                    print(f"COMMIT-FAILED {e!r}", flush=True)
    finally:
        await c.stop()


if __name__ == "__main__":
    asyncio.run(run())
