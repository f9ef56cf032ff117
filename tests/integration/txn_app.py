"""A consume-transform-produce application (librdkafka's transactional API), run as its own
process by test_transactions.py so that it can be SIGKILLed mid-transaction.

    python -m tests.integration.txn_app BOOTSTRAP TXN_ID GROUP IN OUT PER_TXN [HANG_AFTER]

Reads IN (read_committed) from the group's committed offsets, writes b"x" + value to OUT with
the same partition, and commits each PER_TXN records with their offsets in one transaction;
stops after 5 s without input once it has partitions ("DONE n"; a killed incarnation
holds its partitions until its session times out, 6 s). With HANG_AFTER, the second
transaction stops after HANG_AFTER records, flushed but not committed, prints "HUNG" and
sleeps (to be killed)."""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, Producer


def main(argv: list[str]) -> None:
    bootstrap, tid, group, src, dst, per_txn = argv[:6]
    hang_after = int(argv[6]) if len(argv) > 6 else -1
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    p.init_transactions(30)  # fences an earlier incarnation and aborts its transaction
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                  "isolation.level": "read_committed"})
    c.subscribe([src])
    done, txns, idle_since = 0, 0, time.monotonic()
    deadline = time.monotonic() + 90
    while time.monotonic() - idle_since < 5 and time.monotonic() < deadline:
        batch = [m for m in c.consume(int(per_txn), 1.0) if not m.error()]
        if not c.assignment():
            idle_since = time.monotonic()  # not idle: waiting for partitions
        if not batch:
            continue
        idle_since = time.monotonic()
        p.begin_transaction()
        for i, m in enumerate(batch):
            p.produce(dst, value=b"x" + m.value(), partition=m.partition())
            if txns == 1 and i + 1 == min(hang_after, len(batch)):
                p.flush(30)
                print("HUNG", flush=True)
                time.sleep(600)
        p.send_offsets_to_transaction(c.position(c.assignment()),
                                      c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        txns += 1
        done += len(batch)
    c.close()
    print(f"DONE {done}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
