"""One module per API; importing this package registers every handler."""

from broker.handlers import (  # noqa: F401
    api_versions,
    configs,
    delete_records,
    fetch,
    group_admin,
    groups,
    metadata,
    offsets,
    produce,
    producer_ids,
    reassignments,
    topics,
    txn,
    txn_admin,
    txn_markers,
    txn_offsets,
)
from broker.handlers.base import REGISTRY, BrokerContext, Later

__all__ = ["REGISTRY", "BrokerContext", "Later"]
