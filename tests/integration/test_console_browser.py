"""The web console in a real browser: headless Chromium (Debian's package) loads the admin
port's `/` while a table topic runs; the DOM it renders shows the table's lag and dead-letter
count that the same broker's /status reports, and screenshots are kept as test artefacts
(.cache/artifacts/console-*.png).

What must hold: the page a browser renders agrees with /status at that moment (paused writer,
so the figures hold still), and it renders again after the writer catches up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.tableops import cli, produce, status, wait_keys, wait_status
from tests.integration.test_table_console import Ids
from tests.integration.test_table_topic import create_table_topic, start

pytestmark = pytest.mark.integration

ARTIFACTS = Path(__file__).resolve().parents[2] / ".cache" / "artifacts"


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium not installed (./dev installs Debian's chromium)")
    return exe


def render(exe: str, url: str, screenshot: Path, profile: Path) -> str:
    """The DOM Chromium builds for url (and a screenshot of it)."""
    base = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
            f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,1800"]
    env = {**os.environ, "HOME": str(profile)}
    shot = subprocess.run([*base, f"--screenshot={screenshot}", url], env=env,
                          capture_output=True, timeout=90)
    assert shot.returncode == 0, shot.stderr.decode(errors="replace")[-2000:]
    assert screenshot.stat().st_size > 10_000  # a rendered page, not an empty canvas
    dom = subprocess.run([*base, "--dump-dom", url], env=env, capture_output=True, timeout=90)
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    return dom.stdout.decode()


def test_console_in_headless_chromium(tmp_path: Path) -> None:
    exe = chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "data"
    broker = start(tmp_path)
    try:
        admin = broker.admin_address()
        create_table_topic(broker.bootstrap, "shown", 2,
                           **{"table.topic.commit.interval.ms": "300"})
        acked = produce(broker.bootstrap, "shown",
                        [*({"n": i} for i in range(30)), b"{bad", b"{bad"], 2)
        wait_keys(data, "shown", set(acked) - {(0, 15), (1, 15)})
        wait_status(admin, "shown", lambda s: s["dead_letters"] == 2)

        assert cli(admin, "pause", "shown", "--reason", "browser check")[0] == 0
        wait_status(admin, "shown", lambda s: s["paused"] == "browser check")
        produce(broker.bootstrap, "shown", [{"n": i} for i in range(100, 114)], 2)
        time.sleep(1.0)  # the new records are acked and wait behind the paused writer

        ids = Ids()
        ids.feed(render(exe, f"http://{admin}/", ARTIFACTS / "console-paused.png",
                        tmp_path / "profile"))
        st = status(admin, "shown")
        assert ids.text["dlq-shown"] == str(st["dead_letters"]) == "2"
        lags = {p["partition"]: p["lag_records"] for p in st["partitions"]}
        assert lags == {0: 7, 1: 7}
        for p, lag in lags.items():
            assert ids.text[f"lag-shown-{p}"] == str(lag)
        assert "PAUSED: browser check" in ids.text["state-shown"]
        # brokers, bytes per partition and costs per topic and table, as /status has them
        with urllib.request.urlopen(f"http://{admin}/status", timeout=10) as r:
            full = json.loads(r.read())
        (me,) = full["brokers"]
        assert "this broker" in ids.text[f"broker-{me['node_id']}"]
        (topic,) = [t for t in full["topics"] if t["topic"] == "shown"]
        for p in topic["partitions"]:
            assert ids.text[f"bytes-in-shown-{p['partition']}"] == str(p["bytes_in"])
            assert ids.text[f"bytes-out-shown-{p['partition']}"] == str(p["bytes_out"])
        for op, c in full["costs"]["topics"]["shown"].items():
            assert ids.text[f"cost-shown-{op}-bytes"] == f"{c['bytes']:.0f}"
        assert ids.text["tcost-shown-PUT-bytes"] == f"{st['costs']['PUT']['bytes']:.0f}"

        assert cli(admin, "resume", "shown")[0] == 0
        wait_status(admin, "shown", lambda s: all(p["lag_records"] == 0
                                                   for p in s["partitions"]))
        ids = Ids()
        ids.feed(render(exe, f"http://{admin}/", ARTIFACTS / "console-running.png",
                        tmp_path / "profile"))
        assert ids.text["state-shown"] == "running"
        assert ids.text["lag-shown-0"] == ids.text["lag-shown-1"] == "0"
        assert ids.text["dlq-shown"] == "2"
    finally:
        broker.stop()
