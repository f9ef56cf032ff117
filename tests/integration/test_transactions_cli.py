"""`floe transactions list|describe` against a real broker with librdkafka transactions.

What must hold: an open transaction is listed as Ongoing with its partitions; once committed
it shows CompleteCommit with none; the state filter filters; an unknown id is an error."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from broker.cli import main as floe
from tests.brokerproc import running_broker
from tests.integration.test_transactions import make_topics, txn_producer

pytestmark = pytest.mark.integration


def floe_json(*args: str) -> tuple[int, Any, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = floe(["transactions", *args])
    return code, json.loads(out.getvalue()) if code == 0 else None, err.getvalue()


def test_list_and_describe(tmp_path: Path) -> None:
    with running_broker(tmp_path / "d") as broker:
        b = ("--bootstrap", broker.bootstrap, "--json")
        make_topics(broker.bootstrap, "tcli", partitions=3)
        p = txn_producer(broker.bootstrap, "cli-open")
        p.begin_transaction()
        p.produce("tcli", value=b"x", partition=0)
        p.produce("tcli", value=b"y", partition=2)
        p.flush(30)

        code, rows, err = floe_json("list", *b)
        assert code == 0, err
        assert [(r["transactional_id"], r["state"], r["producer_id"]) for r in rows] == [
            ("cli-open", "Ongoing", rows[0]["producer_id"])]
        assert rows[0]["coordinator"] == broker.bootstrap
        code, doc, err = floe_json("describe", "cli-open", *b)
        assert code == 0, err
        assert doc["state"] == "Ongoing"
        assert doc["partitions"] == ["tcli-0", "tcli-2"]
        assert doc["producer_id"] == rows[0]["producer_id"] and doc["timeout_ms"] > 0
        assert doc["start_time_ms"] > 0

        p.commit_transaction(30)
        code, doc, err = floe_json("describe", "cli-open", *b)
        assert code == 0, err
        assert doc["state"] == "CompleteCommit" and doc["partitions"] == []
        assert floe_json("list", "--state", "Ongoing", *b)[1] == []
        code, rows, _ = floe_json("list", "--state", "CompleteCommit", *b)
        assert [r["transactional_id"] for r in rows] == ["cli-open"]

        code, _, err = floe_json("describe", "no-such-id", *b)
        assert code == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in err.upper()
