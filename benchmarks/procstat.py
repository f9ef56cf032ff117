"""CPU time and peak memory of a process, read from /proc (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcSample:
    cpu_s: float  # user + system seconds so far
    rss_bytes: int  # resident now
    peak_rss_bytes: int  # VmHWM: the highest resident set so far


def sample(pid: int) -> ProcSample | None:
    """CPU seconds and memory of `pid` (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    mem = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            mem[key] = int(value.split()[0]) * 1024
    return ProcSample(cpu, mem.get("VmRSS", 0), mem.get("VmHWM", 0))


def cpu_seconds(pid: int) -> float:
    s = sample(pid)
    return s.cpu_s if s is not None else 0.0


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return (total - idle) / CLK_TCK, total / CLK_TCK


def own_cpu() -> float:
    """CPU seconds of this process and every child it has waited for."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class LoadMeter:
    """How much of the machine's CPU went to processes that are not this run's."""

    def __init__(self) -> None:
        self.busy0, self.total0 = machine_cpu()
        self.own0 = own_cpu()

    def other_share(self) -> float | None:
        busy, total = machine_cpu()
        if total <= self.total0:
            return None
        other = (busy - self.busy0) - (own_cpu() - self.own0)
        return max(0.0, other / (total - self.total0))
