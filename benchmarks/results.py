"""Figures, their ceilings and Tansu counterparts, and the machine they were measured on."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LIBRARIES = (
    "confluent-kafka",
    "kio",
    "uvloop",
    "pyarrow",
    "pyiceberg",
    "msgspec",
    "boto3",
    "moto",
    "matplotlib",
)


@dataclass
class Figure:
    name: str  # system.workload.metric
    system: str
    workload: str
    metric: str
    value: float | None
    unit: str
    higher_is_better: bool = True
    ceiling: float | None = None
    ceiling_source: str = ""
    ratio: float | None = None  # value / ceiling
    tansu: float | None = None  # the same figure measured on the Tansu run it faces
    vs_tansu: float | None = None  # value / tansu
    note: str = ""
    error: str = ""

    def set_ceiling(self, ceiling: float | None, source: str) -> None:
        if ceiling is None or self.value is None or not _finite(ceiling) or ceiling == 0:
            return
        self.ceiling, self.ceiling_source = ceiling, source
        self.ratio = self.value / ceiling

    def set_tansu(self, other: Figure | None) -> None:
        if other is None:
            return
        if other.value is None or not _finite(other.value):
            self.note = (self.note + "; " if self.note else "") + f"Tansu: {other.error}"
            return
        self.tansu = other.value
        if self.value is not None and other.value:
            self.vs_tansu = self.value / other.value


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


@dataclass
class Results:
    quick: bool
    started: str
    machine: dict[str, Any] = field(default_factory=dict)
    git: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)  # plot data, not written to JSON
    duration_s: float = 0.0

    def add(
        self,
        system: str,
        workload: str,
        metric: str,
        value: float | None,
        unit: str,
        higher_is_better: bool = True,
        note: str = "",
        error: str = "",
    ) -> Figure:
        v = value if value is None or _finite(value) else None
        f = Figure(
            f"{system}.{workload}.{metric}",
            system,
            workload,
            metric,
            v,
            unit,
            higher_is_better,
            note=note,
            error=error,
        )
        self.figures.append(f)
        return f

    def get(self, system: str, workload: str, metric: str) -> Figure | None:
        name = f"{system}.{workload}.{metric}"
        return next((f for f in self.figures if f.name == name), None)

    def value(self, system: str, workload: str, metric: str) -> float | None:
        f = self.get(system, workload, metric)
        return None if f is None else f.value

    def error(self, system: str, workload: str, what: str) -> None:
        self.errors.append({"system": system, "workload": workload, "error": what})

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "started": self.started,
            "quick": self.quick,
            "duration_s": round(self.duration_s, 1),
            "git": self.git,
            "machine": self.machine,
            "figures": [_clean(asdict(f)) for f in self.figures],
            "errors": self.errors,
        }

    @classmethod
    def load(cls, path: Path) -> Results:
        data = json.loads(path.read_text())
        r = cls(quick=data["quick"], started=data["started"], machine=data["machine"])
        r.git, r.errors, r.duration_s = data["git"], data["errors"], data["duration_s"]
        r.figures = [Figure(**{"value": None, **f}) for f in data["figures"]]
        return r

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if v is None or v == "":
            continue
        out[k] = round(v, 4) if isinstance(v, float) else v
    return out


def machine_info(tansu: str = "") -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration):
        mem_kb = 0
    libs = {}
    for name in LIBRARIES:
        try:
            libs[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            libs[name] = "absent"
    try:
        import confluent_kafka

        libs["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": libs,
        "tansu": tansu,
    }


def git_info(root: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            out = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=30
            )
            return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    changed = [line for line in git("status", "--porcelain").splitlines() if line]
    return {
        "commit": git("rev-parse", "HEAD"),
        "subject": git("log", "-1", "--format=%s")[:120],
        "dirty_files": len(changed),
    }
