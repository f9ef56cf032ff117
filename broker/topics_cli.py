"""`floe topics create|list|delete`: topic administration over the Kafka protocol."""

from __future__ import annotations

import argparse
import datetime

from broker.client import Client, KafkaClientError, nested


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("topics", help="create, list or delete topics")
    t.add_argument("action", choices=["create", "list", "delete"])
    t.add_argument("name", nargs="?")
    t.add_argument("--partitions", type=int, default=-1, help="default: the broker's")
    t.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic config, e.g. table.topic.enable=true (repeatable)",
    )
    t.add_argument("--bootstrap", help="HOST:PORT (default FLOE_BOOTSTRAP or 127.0.0.1:9092)")


def run(args: argparse.Namespace, bootstrap: str) -> int:
    try:
        with Client(bootstrap) as c:
            if args.action == "list":
                r = c.request(
                    3,
                    12,
                    topics=None,
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
                for t in sorted(r.topics, key=lambda t: t.name):
                    print(f"{t.name}\t{len(t.partitions)} partitions")
                return 0
            if not args.name:
                print(f"floe topics {args.action}: name a topic")
                return 2
            if args.action == "delete":
                state = nested(20, 6, "DeleteTopicState")
                r = c.request(
                    20,
                    6,
                    topics=(state(name=args.name, topic_id=None),),
                    timeout=datetime.timedelta(seconds=30),
                )
                return _result(r.responses[0].error_code, r.responses[0].error_message)
            cfg = nested(19, 7, "CreatableTopicConfig")
            topic = nested(19, 7, "CreatableTopic")
            configs = []
            for item in args.config:
                key, sep, value = item.partition("=")
                if not sep:
                    print(f"--config {item!r}: expected KEY=VALUE")
                    return 2
                configs.append(cfg(name=key, value=value))
            r = c.request(
                19,
                7,
                topics=(
                    topic(
                        name=args.name,
                        num_partitions=args.partitions,
                        replication_factor=-1,
                        assignments=(),
                        configs=tuple(configs),
                    ),
                ),
                timeout=datetime.timedelta(seconds=30),
                validate_only=False,
            )
            return _result(r.topics[0].error_code, r.topics[0].error_message)
    except KafkaClientError as e:
        print(f"floe topics: {e}")
        return 1


def _result(code: int, message: str | None) -> int:
    if code:
        print(f"error {int(code)} ({getattr(code, 'name', code)}): {message or ''}")
        return 1
    print("ok")
    return 0
