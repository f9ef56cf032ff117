"""Transactions (KIP-98): the coordinator and its durable state (.coordinator, .state; rows in
broker.metadata.txns), the markers (.markers) and each partition's open transactions and
aborted ranges, which read_committed fetches are served from (.index, .partitions)."""
