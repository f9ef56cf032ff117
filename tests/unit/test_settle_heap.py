"""broker.app.settle_heap: the start-up work a broker does before it serves, so that no
request pays for it (issue 17: the fixed-rate produce p99 regression)."""

from __future__ import annotations

import gc
import sys

from kio.schema.index import api_key_map

from broker.app import settle_heap
from broker.handlers.base import REGISTRY, nested_class_or_none


def test_every_served_response_is_loaded_and_the_heap_frozen() -> None:
    try:
        settle_heap()
        assert gc.get_freeze_count() > 10_000  # the imports, at least
        for key, served in REGISTRY.items():
            for version in range(served.min_version, served.max_version + 1):
                assert f"kio.schema.{api_key_map[key]}.v{version}.response" in sys.modules
        # the first response of an API (here Produce's nested classes) imports nothing more
        loaded = len(sys.modules)
        produce = REGISTRY[0]
        for version in range(produce.min_version, produce.max_version + 1):
            assert nested_class_or_none(0, version, "PartitionProduceResponse") is not None
            nested_class_or_none(0, version, "BatchIndexAndErrorMessage")
        assert len(sys.modules) == loaded
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
