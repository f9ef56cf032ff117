"""`floe table ...`: the client of the table operations a broker serves on its admin port
(tabletopic.api). `floe table status` stays in broker/cli.py (it reads /status)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tabletopic.lineage import render as render_lineage

ACTIONS = ["status", "lineage", "locate", "pause", "resume", "rollback", "rebuild", "replay-dlq"]
TIMEOUT_S = 120.0  # a rollback or rebuild waits for the writer, then rewrites files


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser(
        "table",
        help="table topics: status, lineage, pause/resume, rollback, rebuild, DLQ replay",
        description="Operate table topics through a broker's admin port. status: freshness "
        "and errors; lineage T: every snapshot with its offset ranges; locate T --partition P "
        "--offset O: the snapshot that first holds a record; pause|resume T: stop or restart "
        "the writer; rollback T --to-snapshot S: back to S, the records after it written "
        "again from the log; rebuild T --from-offset P:O | --all: rewrite from the log; "
        "replay-dlq T [--dry-run]: dead letters whose problem is fixed into the table.",
    )
    t.add_argument("action", choices=ACTIONS)
    t.add_argument("topic", nargs="?", help="the table topic (all but status)")
    t.add_argument("--partition", type=int, help="locate: the record's partition")
    t.add_argument("--offset", type=int, help="locate: the record's offset")
    t.add_argument("--to-snapshot", type=int, help="rollback: the snapshot id")
    t.add_argument(
        "--from-offset", action="append", default=[], metavar="P:O",
        help="rebuild: from this partition's offset (repeatable)",
    )
    t.add_argument("--all", action="store_true", help="rebuild: every partition from its log start")
    t.add_argument("--dry-run", action="store_true", help="replay-dlq: say what would happen")
    t.add_argument("--reason", help="pause: why (shown in status)")
    t.add_argument(
        "--metrics",
        help="the broker's admin HOST:PORT (default FLOE_METRICS, else 127.0.0.1:9644)",
    )
    t.add_argument("--json", action="store_true", help="machine-readable output")


class ApiError(Exception):
    pass


def call(address: str, method: str, topic: str, action: str,
         query: dict[str, str] | None = None) -> dict[str, Any]:
    """One request to /tables/TOPIC/ACTION; ApiError with the broker's message on a refusal."""
    url = f"http://{address}/tables/{urllib.parse.quote(topic, safe='')}/{action}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            doc: dict[str, Any] = json.loads(r.read())
            return doc
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            message = json.loads(body)["error"]
        except (ValueError, KeyError):
            message = body.decode(errors="replace") or str(e)
        raise ApiError(f"{e.code}: {message}") from e


def request_of(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """(method, query) of the action; ValueError for missing arguments."""
    a = args.action
    if a == "lineage":
        return "GET", {}
    if a == "locate":
        if args.partition is None or args.offset is None:
            raise ValueError("locate needs --partition and --offset")
        return "GET", {"partition": str(args.partition), "offset": str(args.offset)}
    if a == "pause":
        return "POST", {"reason": args.reason} if args.reason else {}
    if a == "resume":
        return "POST", {}
    if a == "rollback":
        if args.to_snapshot is None:
            raise ValueError("rollback needs --to-snapshot S")
        return "POST", {"snapshot": str(args.to_snapshot)}
    if a == "rebuild":
        if bool(args.from_offset) == args.all:
            raise ValueError("rebuild needs either --from-offset P:O (repeatable) or --all")
        return "POST", {"all": "true"} if args.all else {"from": ",".join(args.from_offset)}
    return "POST", {"dry_run": "true"} if args.dry_run else {}


def render(action: str, topic: str, doc: dict[str, Any]) -> str:
    if action == "lineage":
        return render_lineage(topic, doc)
    if action == "locate":
        s = doc["snapshot"]
        where = f"partition {doc['partition']} offset {doc['offset']}"
        if s is None:
            return f"{topic}: no snapshot holds {where}"
        return (f"{topic}: {where} is first held by snapshot {s['snapshot_id']} "
                f"({s['operation']}, offsets {s['ranges'][str(doc['partition'])]})")
    if action in ("pause", "resume"):
        return f"{topic}: {'paused' if doc['paused'] else 'resumed'}"
    if action == "rollback":
        return (f"{topic}: rolled back to snapshot {doc['snapshot']}; offsets "
                f"{doc['offsets_before']} -> {doc['offsets']}; the writer writes the rest again")
    if action == "rebuild" and "rows" in doc:
        return (f"{topic}: rebuilt from {doc['from']} up to {doc['offsets']}: {doc['rows']} rows "
                f"rewritten from the log in snapshot {doc['snapshot']}, {doc['dead_letters']} "
                "records to the dead-letter topic")
    if action == "rebuild":  # an upsert table: rewound, the writer writes the log again
        return (f"{topic}: offsets {doc['offsets_before']} -> {doc['offsets']}; every row was "
                "removed and the writer writes the log again")
    lines = [f"{topic}: {doc['dead_letters']} dead letters, {doc['already_in_table']} already "
             f"in the table, {doc['replayed']} {'to replay' if doc['dry_run'] else 'replayed'}"
             + (f" (snapshot {doc['snapshot']})" if doc["snapshot"] else "")
             + f", {len(doc['still_bad'])} still bad"]
    lines += [f"  p{b['partition']} offset {b['offset']}: {b['reason']}" for b in doc["still_bad"]]
    return "\n".join(lines)


def run(args: argparse.Namespace, address: str) -> int:
    if not args.topic:
        print(f"floe table {args.action}: name a table topic", file=sys.stderr)
        return 2
    try:
        method, query = request_of(args)
    except ValueError as e:
        print(f"floe table {args.action}: {e}", file=sys.stderr)
        return 2
    try:
        doc = call(address, method, args.topic, args.action, query)
    except ApiError as e:
        print(f"floe table {args.action}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"floe table {args.action}: cannot reach the broker's admin port {address}: {e}",
              file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else render(args.action, args.topic, doc))
    return 0
