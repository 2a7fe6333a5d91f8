"""Code sandbox throughput: rlloom.rewards.code vs a naive `subprocess.run(["python", file])` per program.

Both sides check HumanEval's 164 canonical solutions with the same parallelism (a thread pool of --workers
runs, each one child process), in the same run, several times; we report medians. The naive floor is what many
RL code-reward scripts do: write prompt + solution + test + `check(entry_point)` to a file and run it with no
isolation at all (full environment, network, writable filesystem, no process limit, trusts the exit code).
Start-up latency is measured separately on a trivial program, one at a time.

    .venv/bin/python bench/code_sandbox.py [--repeats 5] [--workers 2]

`--against SRC` compares two versions of the sandbox instead: this checkout's and the `rlloom.rewards` under SRC
(e.g. a baseline worktree: `git worktree add /tmp/rewards_base HEAD`, then `--against
/tmp/rewards_base/packages/rewards/src`). Each repeat runs both, alternating which goes first, each in a fresh
child process with its source first on `sys.path`: the HumanEval 164 through `check_many` (after a warm-up of 8),
then serial `execute("pass")` latency; it prints medians and the new/old ratios.
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
            entry_point=r["entry_point"], helpers=r["prompt"], limits=Limits(timeout=10),
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


def one_side(workers: int, latency_runs: int) -> None:
    """Child process of --against: one pass of the HumanEval 164 and serial start-up latency, as JSON."""
    from rlloom.rewards import code

    rows = load()
    sandboxed(rows[:8], workers)
    seconds, passed = sandboxed(rows, workers)
    times = []
    for _ in range(latency_runs):
        start = time.perf_counter()
        assert execute("pass").status == "ok"
        times.append(time.perf_counter() - start)
    print(
        json.dumps({"seconds": seconds, "passed": passed, "latency": statistics.median(times), "from": code.__file__})
    )


def against(src: str, repeats: int, workers: int, latency_runs: int) -> None:
    """This checkout's sandbox against the one under `src`, alternating, each pass in a fresh child process."""
    here = str(Path(__file__).resolve().parents[1] / "packages/rewards/src")
    sides = {"new (this checkout)": here, f"old ({src})": src}
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for rep in range(repeats):
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        for name in order:
            command = [sys.executable, __file__, "--one-side", "--workers", str(workers)]
            command += ["--latency-runs", str(latency_runs)]
            env = {**os.environ, "PYTHONPATH": sides[name] + os.pathsep + os.environ.get("PYTHONPATH", "")}
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=1800)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["from"].startswith(sides[name]), (name, result["from"])
            found[name].append(result)
            print(
                f"repeat {rep} {name}: {result['seconds']:.2f} s ({result['passed']}/164 pass, "
                f"{164 / result['seconds']:.1f} programs/s), start-up {result['latency'] * 1000:.1f} ms",
                flush=True,
            )
    print()
    print("| sandbox | programs/s (median) | HumanEval passed | start-up latency (median) |")
    print("|---|---|---|---|")
    medians = {}
    for name, results in found.items():
        rate = statistics.median(164 / r["seconds"] for r in results)
        latency = statistics.median(r["latency"] for r in results)
        passed = sorted({r["passed"] for r in results})
        medians[name] = (rate, latency)
        print(f"| {name} | {rate:.1f} | {passed} | {latency * 1000:.1f} ms |")
    (new_rate, new_latency), (old_rate, old_latency) = medians.values()
    print(
        f"\nthroughput new/old: {new_rate / old_rate:.2f}x; start-up latency new/old: {new_latency / old_latency:.2f}x"
    )
    new_runs, old_runs = found.values()
    pairs = sorted(old["seconds"] / new["seconds"] for new, old in zip(new_runs, old_runs, strict=True))
    median = statistics.median(pairs)
    print(f"paired throughput new/old (same repeat): median {median:.2f}x, {pairs[0]:.2f}-{pairs[-1]:.2f}x")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--latency-runs", type=int, default=50)
    parser.add_argument("--against", metavar="SRC", help="compare with the rlloom.rewards under SRC instead")
    parser.add_argument("--one-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_side:
        one_side(args.workers, args.latency_runs)
        return
    if args.against:
        against(args.against, args.repeats, args.workers, args.latency_runs)
        return
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
