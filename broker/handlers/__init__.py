"""One module per API; importing this package registers every handler."""

from broker.handlers import (  # noqa: F401
    api_versions,
    configs,
    fetch,
    metadata,
    produce,
    topics,
)
from broker.handlers.base import REGISTRY, BrokerContext, Later

__all__ = ["REGISTRY", "BrokerContext", "Later"]
