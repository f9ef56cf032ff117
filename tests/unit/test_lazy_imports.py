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
