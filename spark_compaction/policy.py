"""Which maintenance a table needs, decided from its stats (pure: no Spark, no I/O).

A table topic commits every few seconds: each commit adds small data files, a manifest and a
snapshot (and pyiceberg rewrites the whole metadata file, snapshot list included, on every
commit). Left alone, scans slow down with the file count and commits slow down with the
snapshot count. The thresholds below say when each job pays off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024


@dataclass(frozen=True)
class TableStats:
    """What the policy looks at, for one table's current state."""

    table: str
    data_files: int = 0
    data_bytes: int = 0
    small_data_files: int = 0  # data files below Thresholds.small_file_bytes
    delete_files: int = 0
    manifests: int = 0
    snapshots: int = 0
    oldest_snapshot_ms: int | None = None  # commit time of the oldest snapshot kept

    @property
    def avg_file_bytes(self) -> float:
        return self.data_bytes / self.data_files if self.data_files else 0.0


@dataclass(frozen=True)
class Thresholds:
    small_file_bytes: int = 32 * MiB  # a data file below this is "small"
    min_small_files: int = 20  # rewrite data files once this many are small ...
    min_data_files: int = 50  # ... or once there are this many files and ...
    min_avg_file_bytes: int = 64 * MiB  # ... their average size is below this
    max_manifests: int = 50  # rewrite manifests past this many
    max_snapshots: int = 500  # expire snapshots past this many ...
    max_snapshot_age_s: float = 3600.0  # ... or once the oldest is older than this ...
    snapshot_age_slack: float = 0.25  # ... by this fraction (no expiry every round)
    retain_last: int = 20  # never expire below this many snapshots
    orphan_interval_s: float = 24 * 3600.0  # look for orphan files this often per table

    def __post_init__(self) -> None:
        if self.retain_last < 1:
            raise ValueError("retain_last must be at least 1 (the current snapshot)")
        for name in ("small_file_bytes", "min_small_files", "min_data_files", "max_manifests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.max_snapshot_age_s < 0 or self.snapshot_age_slack < 0:
            raise ValueError("snapshot ages must not be negative")


@dataclass(frozen=True)
class Decision:
    table: str
    rewrite_data_files: bool = False
    rewrite_manifests: bool = False
    expire_snapshots: bool = False
    remove_orphan_files: bool = False
    reasons: dict[str, str] = field(default_factory=dict)  # job -> why

    @property
    def any(self) -> bool:
        return (
            self.rewrite_data_files
            or self.rewrite_manifests
            or self.expire_snapshots
            or self.remove_orphan_files
        )

    @property
    def jobs(self) -> list[str]:
        """The jobs to run, in the order they should run."""
        order = ("rewrite_data_files", "rewrite_manifests", "expire_snapshots")
        out = [j for j in order if getattr(self, j)]
        if self.remove_orphan_files:
            out.append("remove_orphan_files")
        return out


def decide(
    stats: TableStats,
    thresholds: Thresholds,
    now_ms: int,
    last_orphan_run_ms: int | None = None,
) -> Decision:
    """The jobs `stats` call for. `last_orphan_run_ms`: when orphan files were last removed
    from this table (None: never, as far as the caller knows)."""
    t = thresholds
    reasons: dict[str, str] = {}

    rewrite = False
    if stats.small_data_files >= t.min_small_files:
        rewrite = True
        reasons["rewrite_data_files"] = (
            f"{stats.small_data_files} small data files (>= {t.min_small_files})"
        )
    elif stats.data_files >= t.min_data_files and stats.avg_file_bytes < t.min_avg_file_bytes:
        rewrite = True
        reasons["rewrite_data_files"] = (
            f"{stats.data_files} data files averaging {stats.avg_file_bytes / MiB:.1f} MiB "
            f"(>= {t.min_data_files} files, < {t.min_avg_file_bytes / MiB:.0f} MiB)"
        )

    manifests = stats.manifests > t.max_manifests
    if manifests:
        reasons["rewrite_manifests"] = f"{stats.manifests} manifests (> {t.max_manifests})"

    expire = False
    if stats.snapshots > t.retain_last:
        if stats.snapshots > t.max_snapshots:
            expire = True
            reasons["expire_snapshots"] = f"{stats.snapshots} snapshots (> {t.max_snapshots})"
        elif stats.oldest_snapshot_ms is not None:
            age_s = (now_ms - stats.oldest_snapshot_ms) / 1000
            if age_s > t.max_snapshot_age_s * (1 + t.snapshot_age_slack):
                expire = True
                why = f"oldest snapshot {age_s:.0f}s old (> {t.max_snapshot_age_s:.0f}s)"
                reasons["expire_snapshots"] = why

    orphans = (
        last_orphan_run_ms is None or (now_ms - last_orphan_run_ms) / 1000 >= t.orphan_interval_s
    )
    if orphans:
        reasons["remove_orphan_files"] = (
            "orphan files never looked for"
            if last_orphan_run_ms is None
            else f"orphan files last looked for {(now_ms - last_orphan_run_ms) / 1000:.0f}s ago"
        )
    return Decision(stats.table, rewrite, manifests, expire, orphans, reasons)
