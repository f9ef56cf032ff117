"""The workloads, shaped like the OpenMessaging Benchmark's: one topic, 16 or 100 partitions,
1 KiB or 100 B records (an 8-byte key holding the send time + the value), acks=all.

Max-rate workloads produce as fast as one librdkafka producer can for `duration` seconds,
without a consumer (so the figure compares with the null broker, which has none), then read
the topic back (warm read). Fixed-rate workloads send on a fixed timetable with a consumer
tailing the topic, for produce latency from the intended send time and end-to-end latency.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class Workload:
    name: str
    size: int  # bytes per record: key (8) + value
    partitions: int
    rate: float  # records/s; 0: as fast as possible
    duration: float  # seconds of sending
    flush_timeout: float = 30.0  # then whatever is not acknowledged counts as lost

    @property
    def fixed(self) -> bool:
        return self.rate > 0

    def describe(self) -> str:
        size = f"{self.size // KIB} KiB" if self.size >= KIB else f"{self.size} B"
        rate = (
            f"fixed {self.rate:,.0f} rec/s ({self.rate * self.size / 2**20:.1f} MiB/s)"
            if self.fixed
            else "max rate"
        )
        return f"1 topic x {self.partitions} partitions x {size}, {rate}, {self.duration:g} s"


def workloads(quick: bool) -> list[Workload]:
    if quick:
        return [
            Workload("max-1k-16p", KIB, 16, 0, 2.5, flush_timeout=6),
            Workload("fixed-1k-16p", KIB, 16, 5_000, 3, flush_timeout=3),
        ]
    return [
        Workload("max-1k-16p", KIB, 16, 0, 15),
        Workload("max-1k-100p", KIB, 100, 0, 15),
        Workload("max-100b-16p", 100, 16, 0, 15),
        Workload("fixed-1k-16p", KIB, 16, 10_240, 20),
        Workload("fixed-100b-16p", 100, 16, 20_000, 15),
    ]


CATCHUP_WORKLOAD = "max-1k-16p"  # the topic read back cold after a broker restart


@dataclass(frozen=True)
class TablePlan:
    rate: float  # JSON records/s, steady
    duration: float
    partitions: int
    size: int  # bytes per JSON record
    backlog_s: float  # seconds of max-rate JSON produced before the table is switched on
    convert_rows: int  # in-process conversion benchmark


def table_plan(quick: bool) -> TablePlan:
    if quick:
        return TablePlan(
            rate=1_000, duration=4, partitions=4, size=256, backlog_s=0.6, convert_rows=50_000
        )
    return TablePlan(
        rate=2_000, duration=30, partitions=4, size=256, backlog_s=6, convert_rows=200_000
    )
