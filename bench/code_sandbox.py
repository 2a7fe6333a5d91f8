"""Code sandbox throughput: rlloom.rewards.code vs a naive `subprocess.run(["python", file])` per program.

Both sides check HumanEval's 164 canonical solutions with the same parallelism (a thread pool of --workers
runs, each one child process), in the same run, several times; we report medians. The naive floor is what many
RL code-reward scripts do: write prompt + solution + test + `check(entry_point)` to a file and run it with no
isolation at all (full environment, network, writable filesystem, no process limit, trusts the exit code).
Start-up latency is measured separately on a trivial program, one at a time.

    .venv/bin/python bench/code_sandbox.py [--repeats 5] [--workers 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlloom.rewards.code import CodeTask, Limits, check_many, execute, isolation

DATA = Path(__file__).resolve().parents[1] / "packages/rewards/tests/data/code_humaneval.jsonl.gz"


def load() -> list[dict[str, Any]]:
    with gzip.open(DATA, "rt") as f:
        return [json.loads(line) for line in f]


def naive_one(row: dict[str, Any], tmp: str, flags: tuple[str, ...]) -> bool:
    source = row["prompt"] + row["canonical_solution"] + "\n" + row["test"] + f"\ncheck({row['entry_point']})\n"
    path = os.path.join(tmp, row["task_id"].replace("/", "_") + ".py")
    with open(path, "w") as f:
        f.write(source)
    try:
        run = subprocess.run([sys.executable, *flags, path], check=False, capture_output=True, timeout=10)
        return run.returncode == 0
    except subprocess.TimeoutExpired:
        return False


def naive(rows: list[dict[str, Any]], workers: int, flags: tuple[str, ...] = ()) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(workers) as pool:
        start = time.perf_counter()
        passed = sum(pool.map(lambda r: naive_one(r, tmp, flags), rows))
        return time.perf_counter() - start, passed


def sandboxed(rows: list[dict[str, Any]], workers: int) -> tuple[float, int]:
    tasks = [
        CodeTask(
            kind="function", code=r["prompt"] + r["canonical_solution"], test=r["test"],
            entry_point=r["entry_point"], limits=Limits(timeout=10),
        )
        for r in rows
    ]  # fmt: skip
    start = time.perf_counter()
    results = check_many(tasks, max_workers=workers)
    return time.perf_counter() - start, sum(r.status == "passed" for r in results)


def startup_latency(n: int) -> tuple[float, float, float]:
    """Median wall time of one trivial program, interleaved: naive, naive -I -S, the sandbox (serial, no pool)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "noop.py")
        Path(path).write_text("pass\n")
        times: list[list[float]] = [[], [], []]
        for _ in range(n):
            for i, flags in enumerate([(), ("-I", "-S")]):
                start = time.perf_counter()
                subprocess.run([sys.executable, *flags, path], capture_output=True, timeout=10, check=True)
                times[i].append(time.perf_counter() - start)
            start = time.perf_counter()
            assert execute("pass").status == "ok"
            times[2].append(time.perf_counter() - start)
    naive_m, bare_m, ours_m = (statistics.median(t) for t in times)
    return naive_m, bare_m, ours_m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--latency-runs", type=int, default=50)
    args = parser.parse_args()
    iso = isolation()
    print(f"isolation: {iso.mode} (strong={iso.strong}); workers={args.workers}; cpus={os.cpu_count()}")
    rows = load()
    sandboxed(rows[:8], args.workers)  # warm the page cache and the probe
    naive_t, bare_t, ours_t = [], [], []
    for rep in range(args.repeats):
        t_naive, p_naive = naive(rows, args.workers)
        t_bare, p_bare = naive(rows, args.workers, ("-I", "-S"))
        t_ours, p_ours = sandboxed(rows, args.workers)
        naive_t.append(t_naive)
        bare_t.append(t_bare)
        ours_t.append(t_ours)
        print(
            f"repeat {rep}: naive {t_naive:.2f}s ({p_naive}/164)  naive -I -S {t_bare:.2f}s ({p_bare}/164)  "
            f"sandbox {t_ours:.2f}s ({p_ours}/164 pass)"
        )
    n_med, b_med, o_med = (statistics.median(t) for t in (naive_t, bare_t, ours_t))
    lat_naive, lat_bare, lat_ours = startup_latency(args.latency_runs)
    print()
    print("| method | programs/s (median) | time ratio vs naive | start-up latency (median) | latency ratio |")
    print("|---|---|---|---|---|")
    for name, med, lat in [
        ("naive `subprocess.run([python, file])`", n_med, lat_naive),
        ("naive with `python -I -S`", b_med, lat_bare),
        (f"rlloom sandbox ({iso.mode})", o_med, lat_ours),
    ]:
        print(f"| {name} | {len(rows) / med:.1f} | {med / n_med:.2f} | {lat * 1000:.1f} ms | {lat / lat_naive:.2f} |")


if __name__ == "__main__":
    main()
