"""A broker without table topics does not import pyarrow (~60 MiB of its memory): the table
writer's modules are imported with the first table topic (tabletopic.manager), the table
operations' with the first operation that needs them (tabletopic.ops, tabletopic.api).
tests/integration/test_table_topic.py checks the running broker."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["broker.app", "broker.cli", "tabletopic.config"])
def test_the_broker_imports_no_arrow(module: str) -> None:
    code = (f"import sys, {module}\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyarrow'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]", f"{module} imported {out.strip()}"


def test_the_writer_still_brings_arrow() -> None:
    """The check above can fail: the writer's module does import pyarrow."""
    code = "import sys, tabletopic.writer\nprint('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "True"


def test_the_first_load_freezes_what_it_imported() -> None:
    """tabletopic.lazyload: the import runs in a thread and its objects are frozen (a full
    collection on the event loop would walk them); a second load freezes nothing more."""
    code = """
import asyncio, gc, sys, threading
import broker.app
from tabletopic import lazyload

threads = []
real = lazyload.importlib.import_module
def spy(name):
    threads.append(threading.current_thread() is threading.main_thread())
    return real(name)
lazyload.importlib.import_module = spy
before = gc.get_freeze_count()
asyncio.run(lazyload.load("tabletopic.writer"))
first = gc.get_freeze_count()
asyncio.run(lazyload.load("tabletopic.writer"))
print("pyarrow" in sys.modules, threads, first - before > 50_000, gc.get_freeze_count() == first)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.split() == ["True", "[False,", "False]", "True", "True"], out
