"""A reader of a floe table topic's Iceberg table, as an analyst's client sees it.

`TableReader` opens the SQL catalog itself (pyiceberg's SqlCatalog on the catalog database,
no broker code) and every READ_POLL_S reads the table's catalog row; when it moved, it loads
the table and notes the current snapshot if it is new (`Seen`: its summary's `floe.offsets`
say which offsets it holds). With `scan_rows`, it also scans that snapshot: plans its files
(pyiceberg) and reads the `_kafka.partition` and `_kafka.offset` columns of every data file it
has not read yet, so a row's visibility is the moment a scan of the current snapshot returned
it, not what the snapshot's summary claims. A row read again from another file counts as a
duplicate (right for tables nobody rewrites while they are read, as the benchmarks' tables).

`scan_offsets` reads the whole current snapshot once (for the set comparison after a run) and
`compare_rows` compares it with the acknowledged (partition, offset) pairs.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

READ_POLL_S = 0.05
CATALOG_NAME = "floe"  # rows of pyiceberg's SQL catalog are keyed by catalog name
OFFSET_COLUMNS = ["_kafka.partition", "_kafka.offset"]

Acks = dict[int, list[tuple[int, float]]]  # partition -> [(offset, acknowledged at)]


@dataclass(frozen=True)
class Seen:
    """A snapshot, as the reader first had it."""

    at: float  # wall clock: the reader's load that returned it ended
    snapshot_id: int
    committed_at: float  # the snapshot's timestamp
    offsets: dict[int, int]  # floe.offsets of its summary: next offset per partition
    total_records: int


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    acked_at: float
    visible_at: float | None  # None: never visible before the end
    committed_at: float | None  # the timestamp of the first snapshot holding it

    @property
    def freshness(self) -> float | None:
        return None if self.visible_at is None else self.visible_at - self.acked_at


def visibility(acks: Acks, seen: list[Seen]) -> list[Record]:
    """Every acknowledged record with the first snapshot the reader saw that holds it (by
    the snapshots' `floe.offsets`)."""
    out: list[Record] = []
    for p, entries in sorted(acks.items()):
        reach: list[int] = []  # offsets never move back; a running max guards the search
        for s in seen:
            reach.append(max(s.offsets.get(p, 0), reach[-1] if reach else 0))
        for offset, acked_at in entries:
            i = bisect.bisect_right(reach, offset)  # the first snapshot past `offset`
            if i < len(seen):
                out.append(Record(p, offset, acked_at, seen[i].at, seen[i].committed_at))
            else:
                out.append(Record(p, offset, acked_at, None, None))
    return out


def row_visibility(acks: Acks, rows: dict[tuple[int, int], tuple[float, float]]) -> list[Record]:
    """Every acknowledged record with the moment a scan first returned its row (`rows`:
    (partition, offset) -> (read at, commit time of the snapshot it was read from))."""
    out: list[Record] = []
    for p, entries in sorted(acks.items()):
        for offset, acked_at in entries:
            hit = rows.get((p, offset))
            out.append(Record(p, offset, acked_at, *(hit if hit else (None, None))))
    return out


@dataclass(frozen=True)
class RowCheck:
    rows: int  # rows in the table
    missing: int  # acknowledged, not in the table
    extra: int  # in the table, never acknowledged
    duplicates: int  # rows beyond the first of the same (partition, offset)

    @property
    def problem(self) -> str:
        if not (self.missing or self.extra or self.duplicates):
            return ""
        return (
            f"table vs acknowledged records: {self.missing} missing, {self.extra} never "
            f"acknowledged, {self.duplicates} duplicated"
        )


def compare_rows(acked: Iterable[tuple[int, int]], rows: Iterable[tuple[int, int]]) -> RowCheck:
    counts = Counter(rows)
    want = set(acked)
    have = set(counts)
    return RowCheck(
        rows=sum(counts.values()),
        missing=len(want - have),
        extra=len(have - want),
        duplicates=sum(n - 1 for n in counts.values()),
    )


def parse_offsets(raw: str | None) -> dict[int, int]:
    """A snapshot summary's `floe.offsets` ({"partition": next offset}, JSON)."""
    return {int(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


def open_catalog(catalog_uri: str, warehouse: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(CATALOG_NAME, uri=catalog_uri, warehouse=warehouse)


def metadata_location(catalog: Any, table: tuple[str, str]) -> str | None:
    """The table's row in pyiceberg's SQL catalog: its current metadata file (None: no
    table yet)."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    with Session(catalog.engine) as session:
        loc: str | None = session.execute(
            select(IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == table[0],
                IcebergTables.table_name == table[1],
            )
        ).scalar_one_or_none()
        return loc


def read_offsets(table: Any, path: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of one data file of `table`."""
    import pyarrow.parquet as pq

    with table.io.new_input(path).open() as f:
        cols = pq.read_table(f, columns=OFFSET_COLUMNS)
    return list(zip(cols.column(0).to_pylist(), cols.column(1).to_pylist(), strict=True))


def scan_offsets(catalog_uri: str, warehouse: str, table: tuple[str, str]) -> list[tuple[int, int]]:
    """(partition, offset) of every row of the table's current snapshot (empty: none)."""
    t = open_catalog(catalog_uri, warehouse).load_table(table)
    if t.current_snapshot() is None:
        return []
    return [po for task in t.scan().plan_files() for po in read_offsets(t, task.file.file_path)]


@dataclass
class TableReader:
    """Every READ_POLL_S, with its own pyiceberg catalog: reads the table's metadata pointer
    in the catalog (one row), and when it moved loads the table (what load_table reads:
    the row, then the metadata file) and notes the current snapshot if it is new (Seen).
    Looking at the row first keeps the reader's CPU off the shared cores between commits; a
    snapshot is noted when the load that returned it ended. `scan_rows`: see the module."""

    catalog_uri: str
    warehouse: str
    table: tuple[str, str]
    scan_rows: bool = False
    seen: list[Seen] = field(default_factory=list)
    # scan_rows: (partition, offset) -> (first read at, commit time of its snapshot)
    rows: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    duplicates: int = 0
    polls: int = 0
    loads: int = 0
    load_s: float = 0.0  # time spent in load_table (and the scans)
    errors: int = 0
    last_error: str = ""
    _files: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="iceberg reader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def offsets(self) -> dict[int, int]:
        return dict(self.seen[-1].offsets) if self.seen else {}

    def _run(self) -> None:
        catalog = open_catalog(self.catalog_uri, self.warehouse)
        pointer: str | None = None
        last: int | None = None
        while not self._stop.is_set():
            began = time.time()
            self.polls += 1
            try:
                now_pointer = metadata_location(catalog, self.table)
                if now_pointer is not None and now_pointer != pointer:
                    table = catalog.load_table(self.table)
                    now = time.time()
                    self.loads += 1
                    snap = table.current_snapshot()
                    if snap is not None and snap.snapshot_id != last:
                        if self.scan_rows:
                            self._scan(table, snap.snapshot_id, snap.timestamp_ms / 1000)
                        last = snap.snapshot_id
                        summary = snap.summary
                        props = summary.additional_properties if summary is not None else {}
                        self.seen.append(
                            Seen(
                                now,
                                snap.snapshot_id,
                                snap.timestamp_ms / 1000,
                                parse_offsets(props.get("floe.offsets")),
                                int(props.get("total-records") or 0),
                            )
                        )
                    pointer = now_pointer
                    self.load_s += time.time() - began
            except Exception as e:  # the catalog busy (SQLite locked), a file mid-write
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
            self._stop.wait(max(0.0, READ_POLL_S - (time.time() - began)))

    def _scan(self, table: Any, snapshot_id: int, committed_at: float) -> None:
        """Reads the data files of the snapshot not read before; each row is visible from
        the moment its file was read."""
        for task in table.scan(snapshot_id=snapshot_id).plan_files():
            path = task.file.file_path
            if path in self._files:
                continue
            offsets = read_offsets(table, path)
            now = time.time()
            for po in offsets:
                if po in self.rows:
                    self.duplicates += 1
                else:
                    self.rows[po] = (now, committed_at)
            self._files.add(path)  # only once read whole: a failed read is tried again

    def wait_for(self, goal: dict[int, int], timeout_s: float) -> bool:
        """Until the newest snapshot seen holds every partition's goal (next offset)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            have = self.offsets()
            if all(have.get(p, 0) >= o for p, o in goal.items()):
                return True
            time.sleep(READ_POLL_S)
        return False
