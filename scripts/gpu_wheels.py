"""Collect the wheels bench/gpu_check.sh installs on a lent GPU machine, for CPython 3.11, 3.12 and 3.13.

The lent machine has torch, transformers, accelerate, peft, httpx and numpy but no network, and rlloom's packages
also need pydantic (with pydantic-core, compiled per Python version, and its three small dependencies) and rich
(the trainer's console tracker, with markdown-it-py, mdurl and pygments). This downloads exactly those, at the
versions this checkout's environment runs (so the GPU runs what CI tested), as manylinux x86-64 binaries, into
`.whl/gpu/cp311`, `cp312` and `cp313` (git ignores `.whl/`; the device call carries it: docs/gpu_check.md).

    python scripts/gpu_wheels.py            # .venv/bin/python: versions from .venv, pip from python3 if needed
    python scripts/gpu_wheels.py --check    # only list what is there and its size
    python scripts/gpu_wheels.py --retrieval 3.12   # also the dense encoding path's wheels, for one Python only

`--retrieval X.Y` adds what the GPU check's `retrieval_encoding` imports beyond the rest: sentence-transformers
and what it imports at once (scikit-learn, scipy, joblib with cloudpickle, threadpoolctl, narwhals) and
rlloom.retrieval's own package imports (bm25s, PyStemmer, tqdm): about 45 MiB more for one Python (scipy alone
34 MiB), so only for the machine's Python (the launcher's log names it: `gpu_check.sh: Python 3.12.3, ...`); 45 MiB
for each of three would pass the device call's 64 MiB. Every run empties `.whl/gpu` first (a plain run afterwards
puts the three small folders back), and exits 1 when the working tree and the wheels would not fit. faiss (18 MiB)
is not carried: encoding never calls it.

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
RETRIEVAL_PACKAGES = (
    "sentence-transformers",
    "scikit-learn",
    "scipy",
    "joblib",
    "cloudpickle",  # joblib 1.6 imports it (no longer vendored)
    "threadpoolctl",
    "narwhals",
    "bm25s",
    "PyStemmer",
    "tqdm",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
CARRY_LIMIT = 64 * 2**20  # the device tool's limit on the working tree and carried paths together


def pins(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """`name==version` of each package as installed beside this interpreter (the checkout's .venv)."""
    missing = []
    found = []
    for name in packages:
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
        shown = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        print(f"{shown}: {len(wheels)} wheels, {size / 2**20:.1f} MiB")
    print(f"total {total / 2**20:.1f} MiB (the device call carries at most {CARRY_LIMIT // 2**20} MiB with the tree)")
    return total


def tree_bytes() -> int:
    """What the device call copies besides the carried paths: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return sum((ROOT / name).stat().st_size for name in listed.split("\0") if name and (ROOT / name).is_file())


def fits(total: int) -> bool:
    """The wheels and the working tree together stay under the device call's limit (a MiB spare)."""
    tree = tree_bytes()
    print(f"working tree {tree / 2**20:.1f} MiB + wheels {total / 2**20:.1f} MiB of {CARRY_LIMIT // 2**20} MiB")
    return total > 0 and tree + total < CARRY_LIMIT - 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report what .whl/gpu holds")
    parser.add_argument(
        "--retrieval",
        metavar="X.Y",
        choices=PYTHONS,
        help="one Python only, with the dense encoding check's wheels too (sentence-transformers, scipy, ...)",
    )
    args = parser.parse_args(argv)
    if not args.check:
        requirements, pip = pins(), pip_command()
        pythons: tuple[str, ...] = PYTHONS
        if args.retrieval:  # 45 MiB more for each Python would not fit: only the machine's
            requirements += pins(RETRIEVAL_PACKAGES)
            pythons = (args.retrieval,)
        shutil.rmtree(FOLDER, ignore_errors=True)  # each run starts empty: no stale pins, no other mode's wheels
        print("gpu_wheels: " + " ".join(requirements))
        for python in pythons:
            download(python, requirements, pip)
    return 0 if fits(report()) else 1


if __name__ == "__main__":
    sys.exit(main())
