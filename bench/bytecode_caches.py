"""What PYTHONDONTWRITEBYTECODE=1 costs each process that rlloom starts: a rank's imports, a Ray rank group's start.

Many container images set PYTHONDONTWRITEBYTECODE=1 (this project's machines do). A venv installed by uv or pip
without `--compile-bytecode` then has no .pyc files, and the variable stops Python from writing them, so every
process compiles each module it imports from source: every Ray rank, every vLLM engine process, every spawned test
rank, at every start. The noxfile lifts the variable for its sessions; a user whose image sets it can compile the
venv once (`python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"`,
or install with `uv pip install --compile-bytecode`).

Each measurement runs in a fresh process whose bytecode cache is a folder of its own (PYTHONPYCACHEPREFIX), so
the venv's own __pycache__ folders play no part:
- "no caches": an empty folder and PYTHONDONTWRITEBYTECODE=1, what a venv without .pyc files gets;
- "caches": a folder that one untimed run filled.
Modes: `imports` times a rank process's imports (torch, FSDP2, transformers' Qwen2, rlloom's rank workers);
`ray-group` (needs the `ray` extra) times a 2-rank `RayActorGroup` start on a tiny Qwen2, whose rank processes
inherit the same cache settings. Alternating repeats; medians and the ratio of this run.

    python bench/bytecode_caches.py [--mode imports|ray-group] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_IMPORTS = (
    "torch.distributed.checkpoint",
    "rlloom.core_rl.distributed.ray_group",
    "rlloom.core_rl.distributed.ranks",
    "rlloom.core_rl.distributed.fsdp",
    "transformers.models.qwen2.modeling_qwen2",
)


def child_imports() -> dict[str, float]:
    import importlib

    started = time.perf_counter()
    for name in RANK_IMPORTS:
        importlib.import_module(name)
    return {"seconds": time.perf_counter() - started}


def child_ray_group(workdir: Path) -> dict[str, float]:
    import ray

    from rlloom.core_rl import char_tokenizer, tiny_qwen2
    from rlloom.core_rl.config import RLConfig
    from rlloom.core_rl.distributed.ray_group import RayActorGroup
    from rlloom.core_rl.distributed.ray_start import start_ray

    model = workdir / "model"
    if not model.exists():
        tokenizer = char_tokenizer()
        tiny_qwen2(tokenizer, seed=0).save_pretrained(model)
        tokenizer.save_pretrained(model)
    cfg = RLConfig.model_validate(
        {
            "model": {"path": str(model)},
            "rollout": {"n": 1, "max_tokens": 8},
            "algorithm": {"advantage": {"estimator": "reinforce_plus_plus"}},
            "trainer": {"device": "cpu"},
            "distributed": {"num_ranks": 2, "cpus_per_rank": 0.5, "timeout_s": 600},
        }
    )
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        started = time.perf_counter()
        group = RayActorGroup(cfg, total_steps=1, weights_path=str(model), with_reference=False)
        seconds = time.perf_counter() - started
        group.close()
    finally:
        ray.shutdown()
    return {"seconds": seconds}


def run_child(mode: str, prefix: Path, *, write: bool, workdir: Path) -> float:
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    if mode == "ray-group":
        env.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rlloom-ray-"))
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--workdir", str(workdir)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("imports", "ray-group"), default="imports")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=("imports", "ray-group"), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child_imports() if args.child == "imports" else child_ray_group(args.workdir)
        print(json.dumps(result))
        return

    with tempfile.TemporaryDirectory(prefix="rlloom-bytecode-") as tmp:
        root = Path(tmp)
        filled = root / "filled"
        run_child(args.mode, filled, write=True, workdir=root)  # fills the cache (and builds the tiny model)
        times: dict[str, list[float]] = {"no caches": [], "caches": []}
        for repeat in range(args.repeats):
            empty = root / f"empty-{repeat}"
            times["no caches"].append(run_child(args.mode, empty, write=False, workdir=root))
            times["caches"].append(run_child(args.mode, filled, write=False, workdir=root))
            print(f"repeat {repeat + 1}: no caches {times['no caches'][-1]:.2f} s, caches {times['caches'][-1]:.2f} s")
    cold, warm = (statistics.median(times[k]) for k in ("no caches", "caches"))
    what = "a rank process's imports" if args.mode == "imports" else "a 2-rank RayActorGroup start"
    print(f"{what}: no caches {cold:.2f} s, caches {warm:.2f} s (medians of {args.repeats}): {cold / warm:.2f}x")


if __name__ == "__main__":
    main()
