"""Consumer group coordination (the classic rebalance protocol) and committed offsets."""
