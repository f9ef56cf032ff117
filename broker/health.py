"""Health of what the broker depends on: the object store, the metadata database and the
Iceberg catalog, each `ok` or its last error with the time it was seen.

Each check is a cheap probe bounded by `PROBE_TIMEOUT_S`: the object store is asked for an
object that does not exist (a not-found answer proves it reachable and the credentials
accepted), the metadata database runs a trivial query (the cluster id), the catalog lists its
namespaces. Probes run at start-up and then every `interval_s` in the background; the object
store's own traffic counts too (a failed PUT between probes shows in `last_error`).

Start-up policy: the broker starts even when the object store or the catalog is unreachable.
It logs one ERROR line naming the store (URL without secrets) before it prints `listening on`,
keeps probing, logs again when the store becomes reachable, and /status says unhealthy
meanwhile. Refusing to start would turn a store that is slow to come up (a MinIO started next to
the broker) into a crash loop, and the broker holds no state that needs the store to be up
first: produce requests simply fail with an error until it is. (An unreachable metadata
database still stops the broker at start-up: it cannot load its topics without it.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("floe")

PROBE_TIMEOUT_S = 5.0
PROBE_KEY = "health/probe-absent-object"


@dataclass
class ComponentHealth:
    """One dependency: `ok` after its last check; the last error and when it was seen."""

    target: str  # what is checked (a URL without secrets)
    ok: bool = False
    checked_at: float = 0.0
    last_error: str = ""
    last_error_at: float = 0.0


Probe = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class HealthCheck:
    """A component to watch, as a storage engine (or the composition root) describes it:
    `probe()` succeeds when it is reachable; `traffic_error()`, if given, reports the last
    error seen outside the probes (message, wall-clock time) or ("", 0)."""

    name: str
    target: str  # what is checked (a URL without secrets)
    probe: Probe
    traffic_error: Callable[[], tuple[str, float]] | None = None


class Health:
    """Probes each component and keeps its latest state; `report()` is the /status JSON."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._probes: dict[str, Probe] = {}
        self._state: dict[str, ComponentHealth] = {}
        self._errors: dict[str, Callable[[], tuple[str, float]]] = {}

    def add(
        self,
        name: str,
        target: str,
        probe: Probe,
        last_error: Callable[[], tuple[str, float]] | None = None,
    ) -> None:
        """Register a component; `last_error()` may report errors seen outside the probes."""
        self._probes[name] = probe
        self._state[name] = ComponentHealth(target)
        if last_error is not None:
            self._errors[name] = last_error

    def add_check(self, check: HealthCheck) -> None:
        self.add(check.name, check.target, check.probe, check.traffic_error)

    def components(self) -> dict[str, ComponentHealth]:
        return dict(self._state)

    async def check(self, name: str) -> ComponentHealth:
        """Probe one component now (bounded by PROBE_TIMEOUT_S); log on a change of state."""
        c = self._state[name]
        was_checked, was_ok = c.checked_at > 0, c.ok
        try:
            await asyncio.wait_for(self._probes[name](), PROBE_TIMEOUT_S)
        except Exception as e:
            if isinstance(e, TimeoutError):
                err = f"no answer within {PROBE_TIMEOUT_S:g} s"
            else:
                err = f"{type(e).__name__}: {e}".strip()[:500]
            c.ok, c.last_error, c.last_error_at = False, err, time.time()
            if was_ok or not was_checked:
                log.error("%s %s is unreachable: %s (still trying)", name.replace("_", " "),
                          c.target, err)
        else:
            c.ok = True
            if was_checked and not was_ok:
                log.info("%s %s is reachable again", name.replace("_", " "), c.target)
        c.checked_at = time.time()
        return c

    async def check_all(self) -> bool:
        results = await asyncio.gather(*(self.check(n) for n in self._probes))
        return all(c.ok for c in results)

    async def run(self) -> None:
        """Probe every component every `interval_s`, forever."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_all()

    def report(self) -> dict[str, Any]:
        """{"healthy": bool, "components": {name: {target, ok, checked_at, last_error,
        last_error_at}}}; a component's traffic errors newer than its probe's are included."""
        out: dict[str, Any] = {}
        for name, c in self._state.items():
            d = asdict(c)
            if name in self._errors:
                err, at = self._errors[name]()
                if err and at > c.last_error_at:
                    d["last_error"], d["last_error_at"] = err, at
            out[name] = d
        return {"healthy": all(c.ok for c in self._state.values()), "components": out}
