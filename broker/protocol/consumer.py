"""The consumer protocol's embedded messages (subscriptions carried in JoinGroup metadata)."""

from __future__ import annotations

import struct
from typing import Any

from kio.index import load_entity_schema
from kio.serial import entity_reader
from kio.static.constants import EntityType

from broker.protocol.framecheck import check_entity

MAX_SUBSCRIPTION_VERSION = 3


def subscription_topics(metadata: bytes) -> set[str]:
    """Topics of a ConsumerProtocolSubscription; empty if it cannot be read."""
    if len(metadata) < 2:
        return set()
    (version,) = struct.unpack_from(">h", metadata, 0)
    version = min(max(version, 0), MAX_SUBSCRIPTION_VERSION)  # newer versions extend older
    try:
        cls = load_entity_schema("consumer_protocol_subscription", version, EntityType.data)
        # bounds first: kio's native reader would reserve memory for any array length
        sub: Any = entity_reader(cls)(check_entity(metadata, 2, cls), 2)[0]
    except Exception:
        return set()
    return set(sub.topics)
