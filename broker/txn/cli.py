"""`floe transactions list|describe`: what the transaction coordinators hold, over the protocol.

`list` asks every broker of the cluster (Metadata) with ListTransactions, as Kafka's admin
client does, and merges the answers; `describe ID` finds the id's coordinator
(FindCoordinator, key type 1) and asks it with DescribeTransactions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

from broker.client import Client, KafkaClientError
from broker.errors import ErrorCode

STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
          "CompleteAbort", "Dead", "PrepareEpochFence")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("transactions", help="transactions: list, or describe one id")
    t.add_argument("action", choices=["list", "describe"])
    t.add_argument("transactional_id", nargs="?")
    t.add_argument("--state", action="append", default=[], choices=STATES,
                   help="list: only transactions in this state (repeatable)")
    t.add_argument(
        "--bootstrap", help="HOST:PORT of a broker (default FLOE_BOOTSTRAP or 127.0.0.1:9092)"
    )
    t.add_argument("--json", action="store_true", help="machine-readable output")


def _brokers(bootstrap: str) -> list[str]:
    with Client(bootstrap) as c:
        md = c.request(3, 9, topics=(), allow_auto_topic_creation=False,
                       include_cluster_authorized_operations=False,
                       include_topic_authorized_operations=False)
    return sorted(f"{b.host}:{b.port}" for b in md.brokers) or [bootstrap]


def list_transactions(bootstrap: str, states: list[str]) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for address in _brokers(bootstrap):
        with Client(address) as c:
            r = c.request(66, 0, state_filters=tuple(states), producer_id_filters=())
        if r.error_code != 0:
            raise KafkaClientError(f"{address}: ListTransactions: {ErrorCode(r.error_code).name}")
        for s in r.transaction_states:
            found[s.transactional_id] = {"transactional_id": s.transactional_id,
                                         "producer_id": int(s.producer_id),
                                         "state": s.transaction_state, "coordinator": address}
    return [found[k] for k in sorted(found)]


def _plain(value: object) -> object:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value) if isinstance(value, int) else value


def describe_transaction(bootstrap: str, transactional_id: str) -> dict[str, Any]:
    with Client(bootstrap) as c:
        (co,) = c.request(10, 4, key_type=1, coordinator_keys=(transactional_id,)).coordinators
    if co.error_code != 0:
        raise KafkaClientError(f"FindCoordinator: {ErrorCode(co.error_code).name}"
                               f" {co.error_message or ''}".rstrip())
    address = f"{co.host}:{co.port}"
    with Client(address) as c:
        (s,) = c.request(65, 0, transactional_ids=(transactional_id,)).transaction_states
    if s.error_code != 0:
        raise KafkaClientError(f"{transactional_id}: {ErrorCode(s.error_code).name}")
    return {
        "transactional_id": s.transactional_id, "coordinator": address,
        "state": s.transaction_state, "producer_id": int(s.producer_id),
        "producer_epoch": int(s.producer_epoch),
        "timeout_ms": _plain(s.transaction_timeout),
        "start_time_ms": _plain(s.transaction_start_time),
        "partitions": sorted(f"{t.topic}-{int(p)}" for t in s.topics for p in t.partitions),
    }


def run(args: argparse.Namespace) -> int:
    bootstrap = args.bootstrap or os.environ.get("FLOE_BOOTSTRAP", "127.0.0.1:9092")
    try:
        if args.action == "list":
            rows = list_transactions(bootstrap, args.state)
            if args.json:
                print(json.dumps(rows))
            else:
                for r in rows:
                    print(f"{r['transactional_id']}\t{r['producer_id']}\t{r['state']}"
                          f"\t{r['coordinator']}")
            return 0
        if not args.transactional_id:
            print("floe transactions describe: name a transactional id", file=sys.stderr)
            return 2
        doc = describe_transaction(bootstrap, args.transactional_id)
        if args.json:
            print(json.dumps(doc))
        else:
            for k, v in doc.items():
                print(f"{k}: {', '.join(v) if isinstance(v, list) else v}")
        return 0
    except KafkaClientError as e:
        print(f"floe transactions: {e}", file=sys.stderr)
        return 1
