"""What a workload costs in object-store requests and bytes, per topic, and how much it moves
per partition (bytes appended and served), for the s3stream engine (broker/storage.py).

s3stream counts by stream id (`s3stream.stats.StreamCosts`, bumped by its object store for
every successful call): a WAL object holds the partitions of many topics, so its PUT is split
over them by their bytes in it (fractional requests, so the topics add up to the total); a
chunk read (GET) goes to the stream read, compaction's GET of a WAL object to the streams it
rewrites by their bytes in it; a stream object's PUT or DELETE (compaction, retention) to its
stream. What no stream can be named for (WAL objects deleted after compaction, listings) is
`unattributed`. Here stream ids become topics and partitions, at
scrape time, from the engine's topic table; a deleted topic's figures are reported as
`DELETED_TOPIC`. Definitions: README.md, "Metrics and health".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from s3stream.stats import Cost, StreamCosts

if TYPE_CHECKING:
    from broker.engine import StorageEngine, Topic

DELETED_TOPIC = "(deleted)"


@dataclass
class Traffic:
    """Record bytes appended to (`bytes_in`) and served from (`bytes_out`) each stream."""

    bytes_in: dict[int, int] = field(default_factory=dict)
    bytes_out: dict[int, int] = field(default_factory=dict)

    def appended(self, stream_id: int, n: int) -> None:
        self.bytes_in[stream_id] = self.bytes_in.get(stream_id, 0) + n

    def served(self, stream_id: int, n: int) -> None:
        self.bytes_out[stream_id] = self.bytes_out.get(stream_id, 0) + n


def stream_names(topics: Mapping[str, Topic]) -> dict[int, tuple[str, int]]:
    """stream id -> (topic, partition)."""
    return {sid: (name, p) for name, t in topics.items() for p, sid in enumerate(t.streams)}


def _cost(c: Cost) -> dict[str, float]:
    return {"requests": round(c.requests, 6), "bytes": round(c.bytes, 3)}


def topic_costs(costs: StreamCosts, names: Mapping[int, tuple[str, int]]) -> dict[str, dict[
        str, Cost]]:
    """{topic: {op: Cost}}, streams summed into their topics."""
    out: dict[str, dict[str, Cost]] = {}
    for sid, ops in list(costs.streams.items()):
        topic = names.get(sid, (DELETED_TOPIC, 0))[0]
        mine = out.setdefault(topic, {})
        for op, c in ops.items():
            t = mine.setdefault(op, Cost())
            t.requests += c.requests
            t.bytes += c.bytes
    return out


def report(costs: StreamCosts, traffic: Traffic, table: StorageEngine) -> dict[str, Any]:
    """The /status parts: `costs` ({"topics": {topic: {op: {requests, bytes}}}, "unattributed",
    "totals"}) and `topics` (per partition: offsets, bytes in and out)."""
    names = stream_names(table.topics)
    per_topic = topic_costs(costs, names)
    topics = []
    for name, t in sorted(table.topics.items()):
        parts = []
        for p, sid in enumerate(t.streams):
            row: dict[str, Any] = {"partition": p, "bytes_in": traffic.bytes_in.get(sid, 0),
                                   "bytes_out": traffic.bytes_out.get(sid, 0)}
            try:
                row["log_start_offset"], row["log_end_offset"] = table.offsets(name, p)
            except Exception:  # led by another broker, or gone meanwhile
                row["log_start_offset"] = row["log_end_offset"] = None
            parts.append(row)
        topics.append({"topic": name, "partitions": parts})
    return {
        "costs": {
            "topics": {t: {op: _cost(c) for op, c in sorted(ops.items())}
                       for t, ops in sorted(per_topic.items())},
            "unattributed": {op: _cost(c) for op, c in sorted(costs.unattributed.items())},
            "totals": {op: _cost(c) for op, c in sorted(costs.totals.items())},
        },
        "topics": topics,
    }


class CostCollector(Collector):
    """Per-topic object-store costs and per-partition traffic of one engine, at scrape time."""

    def __init__(self, costs: StreamCosts, traffic: Traffic, table: StorageEngine) -> None:
        self.costs = costs
        self.traffic = traffic
        self.table = table

    def report(self) -> dict[str, Any]:
        return report(self.costs, self.traffic, self.table)

    def collect(self) -> Iterator[Metric]:
        names = stream_names(self.table.topics)
        tl = ["topic", "op"]
        req = CounterMetricFamily(
            "floe_topic_object_store_requests",
            "Successful object-store requests attributed to a topic (a shared WAL object's "
            "PUT split by the topic's bytes in it: fractional).", labels=tl)
        nbytes = CounterMetricFamily(
            "floe_topic_object_store_bytes",
            "Bytes written (PUT) or read (GET) in object-store requests attributed to a topic.",
            labels=tl)
        for topic, ops in sorted(topic_costs(self.costs, names).items()):
            for op, c in sorted(ops.items()):
                req.add_metric([topic, op], c.requests)
                nbytes.add_metric([topic, op], c.bytes)
        yield req
        yield nbytes
        ureq = CounterMetricFamily(
            "floe_object_store_unattributed_requests",
            "Successful object-store requests no topic could be named for (WAL objects "
            "deleted after compaction, listings).", labels=["op"])
        ubytes = CounterMetricFamily("floe_object_store_unattributed_bytes",
                                     "Bytes of those requests.", labels=["op"])
        for op, c in sorted(self.costs.unattributed.items()):
            ureq.add_metric([op], c.requests)
            ubytes.add_metric([op], c.bytes)
        yield ureq
        yield ubytes
        total = CounterMetricFamily(
            "floe_object_store_bytes",
            "Bytes written (PUT) or read (GET) by successful object-store requests.",
            labels=["op"])
        for op, c in sorted(self.costs.totals.items()):
            total.add_metric([op], c.bytes)
        yield total
        pl = ["topic", "partition"]
        bin_ = CounterMetricFamily("floe_partition_bytes_in",
                                   "Record bytes appended to a partition.", labels=pl)
        bout = CounterMetricFamily("floe_partition_bytes_out",
                                   "Record bytes served from a partition (Fetch, table "
                                   "writers).", labels=pl)
        for sid, (topic, p) in sorted(names.items(), key=lambda kv: kv[1]):
            bin_.add_metric([topic, str(p)], self.traffic.bytes_in.get(sid, 0))
            bout.add_metric([topic, str(p)], self.traffic.bytes_out.get(sid, 0))
        yield bin_
        yield bout
