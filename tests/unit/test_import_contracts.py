"""The package contracts of pyproject.toml ([tool.importlinter]) hold, and they are not vacuous:
without the composition-root exception the layers contract catches broker/app.py importing
tabletopic, and the storage-seam contract catches a direct import of the s3stream engine.
`./dev test` also runs `lint-imports` on its own, after mypy."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(config: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports missing: install the test extra (import-linter)")
    return subprocess.run(
        [exe, "--config", str(config), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    r = lint_imports(ROOT / "pyproject.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def contracts_with(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """pyproject.toml's contracts, each passed through `change`, as a config file."""
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    lines = ["[tool.importlinter]", f"root_packages = {_toml(linter['root_packages'])}"]
    for contract in linter["contracts"]:
        change(contract)
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{key} = {_toml(value)}" for key, value in contract.items()]
    config = tmp_path / "contracts.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def test_the_layers_contract_catches_broker_importing_tabletopic(tmp_path: Path) -> None:
    def drop_root_exception(c: dict[str, Any]) -> None:
        if c["type"] == "layers":
            c["ignore_imports"] = [v for v in c["ignore_imports"] if not v.startswith("broker.app")]

    r = lint_imports(contracts_with(tmp_path, drop_root_exception))
    assert r.returncode != 0
    assert "broker.app -> tabletopic" in r.stdout, r.stdout


def test_the_seam_contract_catches_a_direct_import_of_the_engine(tmp_path: Path) -> None:
    def hold_the_root_to_it(c: dict[str, Any]) -> None:  # broker.app imports broker.storage
        if c["name"].startswith("the storage seam"):
            c["source_modules"] = [*c["source_modules"], "broker.app"]

    r = lint_imports(contracts_with(tmp_path, hold_the_root_to_it))
    assert r.returncode != 0
    assert "broker.app is not allowed to import broker.storage" in r.stdout, r.stdout
