"""A consumer-group member in its own process, for tests that kill members.

    python -m tests.integration.group_member BOOTSTRAP GROUP TOPIC [static-instance-id]

Subscribes with confluent-kafka (librdkafka), prints one line per event on stdout:
`ASSIGNED p,p,...` after each rebalance, `REC partition offset value` for each processed
record (after processing and before its offset is committed: at-least-once), and commits
synchronously after each processed poll batch. Runs until stdin is closed.
"""

from __future__ import annotations

import sys
import threading

from confluent_kafka import Consumer, KafkaException


def main() -> None:
    bootstrap, group, topic = sys.argv[1:4]
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500, "partition.assignment.strategy": "range"}
    if len(sys.argv) > 4:
        conf["group.instance.id"] = sys.argv[4]
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    c = Consumer(conf)

    def on_assign(_c: Consumer, parts: list) -> None:  # type: ignore[type-arg]
        print("ASSIGNED " + ",".join(str(p.partition) for p in parts), flush=True)

    c.subscribe([topic], on_assign=on_assign)
    while not stop.is_set():
        msgs = c.consume(500, 0.2)
        processed = False
        for m in msgs:
            if m.error():
                continue
            print(f"REC {m.partition()} {m.offset()} {m.value().decode()}", flush=True)
            processed = True
        if processed:
            try:
                c.commit(asynchronous=False)
            except KafkaException as e:  # e.g. a rebalance took the partition away
                print(f"COMMIT-FAILED {e}", flush=True)
    c.close()


if __name__ == "__main__":
    main()
