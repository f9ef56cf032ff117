"""The `floe` command line: settings resolution and clear errors, topic administration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def floe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})


def test_print_settings_shows_sources(tmp_path: Path) -> None:
    cfg = tmp_path / "floe.toml"
    cfg.write_text('num_partitions = 4\nlisten = "127.0.0.1:7777"\n')
    r = floe("broker", "--config", str(cfg), "--node-id", "3", "--print-settings",
             env={"FLOE_LISTEN": "127.0.0.1:8888"})
    assert r.returncode == 0, r.stderr
    lines = {line.split(" = ")[0]: line for line in r.stdout.splitlines()}
    assert "= 3" in lines["node.id"] and "(flag;" in lines["node.id"]
    assert "127.0.0.1:8888" in lines["listen"] and "env FLOE_LISTEN" in lines["listen"]
    assert "= 4" in lines["num.partitions"] and "file" in lines["num.partitions"]


def test_bad_settings_fail_with_a_clear_message() -> None:
    r = floe("broker", "--listen", "nowhere", "--print-settings")
    assert r.returncode == 2 and "listen" in r.stderr and "HOST:PORT" in r.stderr
    r = floe("broker", "--set", "no.such=1")
    assert r.returncode == 2 and "no.such" in r.stderr


def test_topics_create_list_delete(broker: BrokerProcess) -> None:
    b = ["--bootstrap", broker.bootstrap]
    r = floe("topics", "create", "orders", "--partitions", "3", "--config",
             "retention.ms=1000", *b)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout
    r = floe("topics", "create", "orders", *b)
    assert r.returncode == 1 and "topic_already_exists" in r.stdout
    r = floe("topics", "create", "bad", "--config", "nope=1", *b)
    assert r.returncode == 1 and "invalid_config" in r.stdout
    assert "orders\t3 partitions" in floe("topics", "list", *b).stdout
    assert floe("topics", "delete", "orders", *b).returncode == 0
    assert "orders" not in floe("topics", "list", *b).stdout
