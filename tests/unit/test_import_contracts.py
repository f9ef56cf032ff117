"""The package contracts of pyproject.toml ([tool.importlinter]) hold, and they are not vacuous:
without the composition-root exception the layers contract catches broker/app.py importing
tabletopic. `./dev test` also runs `lint-imports` on its own, after mypy."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

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


def test_the_layers_contract_catches_broker_importing_tabletopic(tmp_path: Path) -> None:
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    lines = ["[tool.importlinter]", f"root_packages = {_toml(linter['root_packages'])}"]
    for contract in linter["contracts"]:
        lines.append("[[tool.importlinter.contracts]]")
        for key, value in contract.items():
            if key == "ignore_imports" and contract["type"] == "layers":
                value = [v for v in value if not v.startswith("broker.app ")]
            lines.append(f"{key} = {_toml(value)}")
    config = tmp_path / "contracts.toml"
    config.write_text("\n".join(lines) + "\n")
    r = lint_imports(config)
    assert r.returncode != 0
    assert "broker.app -> tabletopic" in r.stdout, r.stdout
