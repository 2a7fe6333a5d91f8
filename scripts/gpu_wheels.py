"""Collect the wheels bench/gpu_check.sh installs on a lent GPU machine, for CPython 3.11, 3.12 and 3.13.

The lent machine has torch, transformers, accelerate, peft, httpx and numpy but no network, and rlloom's packages
also need pydantic (with pydantic-core, compiled per Python version, and its three small dependencies) and rich
(the trainer's console tracker, with markdown-it-py, mdurl and pygments). This downloads exactly those, at the
versions this checkout's environment runs (so the GPU runs what CI tested), as manylinux x86-64 binaries, into
`.whl/gpu/cp311`, `cp312` and `cp313` (git ignores `.whl/`; the device call carries it: docs/gpu_check.md).

    python scripts/gpu_wheels.py            # .venv/bin/python: versions from .venv, pip from python3 if needed
    python scripts/gpu_wheels.py --check    # only list what is there and its size

The wheels are fetched here, before a device call, and not committed: 13 MiB of binaries per refresh in git's
history, and pydantic-core's builds go stale with every pin bump.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / ".whl" / "gpu"
PYTHONS = ("3.11", "3.12", "3.13")
PACKAGES = (
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "rich",
    "markdown-it-py",
    "mdurl",
    "pygments",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
CARRY_LIMIT = 64 * 2**20  # the device tool's limit on the working tree and carried paths together


def pins() -> list[str]:
    """`name==version` of each package as installed beside this interpreter (the checkout's .venv)."""
    missing = []
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        raise SystemExit(f"gpu_wheels: {', '.join(missing)} not installed here; run it with .venv/bin/python")
    return found


def pip_command() -> list[str]:
    """pip of this interpreter, else python3's (uv's venvs have none): it only downloads, so any pip will do."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    python3 = shutil.which("python3")
    if python3 is None:
        raise SystemExit("gpu_wheels: no pip here and no python3 on PATH to borrow pip from")
    return [python3, "-m", "pip"]


def download(python: str, requirements: list[str], pip: list[str]) -> Path:
    target = FOLDER / f"cp{python.replace('.', '')}"
    target.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    cmd = [*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--implementation", "cp"]
    cmd += ["--python-version", python, *platforms, "--dest", str(target), *requirements]
    subprocess.run(cmd, check=True)
    return target


def report() -> int:
    """Print each folder's wheels and the total; returns the total bytes."""
    total = 0
    for python in PYTHONS:
        folder = FOLDER / f"cp{python.replace('.', '')}"
        wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
        size = sum(w.stat().st_size for w in wheels)
        total += size
        print(f"{folder.relative_to(ROOT)}: {len(wheels)} wheels, {size / 2**20:.1f} MiB")
    print(f"total {total / 2**20:.1f} MiB (the device call carries at most {CARRY_LIMIT // 2**20} MiB with the tree)")
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report what .whl/gpu holds")
    args = parser.parse_args(argv)
    if not args.check:
        requirements, pip = pins(), pip_command()
        print("gpu_wheels: " + " ".join(requirements))
        for python in PYTHONS:
            download(python, requirements, pip)
    total = report()
    return 0 if 0 < total < CARRY_LIMIT // 2 else 1


if __name__ == "__main__":
    sys.exit(main())
