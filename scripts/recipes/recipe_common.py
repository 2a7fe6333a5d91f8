"""What both recipes share: the commands they run (logged, timed), the paired bootstrap, and the report.

A recipe is a chain of the apps' own commands (prepare-data, warm-up, train, eval) so that what it reports is what
a user typing those commands gets; this module runs them one after another, keeps each exact command line and its
wall time, and turns per-row scores at three points (untrained, warmed up, after RL) into a JSON report, a
markdown table and a PNG. The interval is a paired bootstrap because the three points score the same held-out
rows: resampling rows (not points) keeps each row's difficulty on both sides of the difference.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

POINTS = ("untrained", "warmup", "rl")


@dataclass(frozen=True)
class Interval:
    """Mean of (after - before) over paired rows and its percentile bootstrap interval."""

    mean: float
    low: float
    high: float
    level: float
    resamples: int
    rows: int

    @property
    def above_zero(self) -> bool:
        return self.low > 0.0


def paired_bootstrap(
    before: Sequence[float], after: Sequence[float], *, resamples: int = 10_000, level: float = 0.95, seed: int = 0
) -> Interval:
    """Percentile bootstrap of mean(after - before): rows are drawn with replacement, the same row on both sides."""
    if len(before) != len(after):
        raise ValueError(f"paired_bootstrap: {len(before)} 'before' scores but {len(after)} 'after'; pair each row")
    if not before:
        raise ValueError("paired_bootstrap: no rows to compare")
    if not 0.0 < level < 1.0:
        raise ValueError(f"paired_bootstrap: level must lie in (0, 1), got {level}")
    diff = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(float(diff.mean()), float(low), float(high), level, resamples, len(diff))


@dataclass
class Runner:
    """Runs commands in order, echoing and logging each, and keeps (command, seconds) for the report."""

    log: Path
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __call__(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, done: Path | None = None
    ) -> float:
        """Run one step; with `done` (a file the step writes last) already there, keep it: a rerun resumes."""
        line = shlex.join(str(a) for a in argv)
        if done is not None and done.exists():
            print(f"[recipe] {name}: kept from an earlier run ({done} exists)", flush=True)
            self.steps.append({"step": name, "command": line, "seconds": 0.0, "exit": 0, "kept": True})
            return 0.0
        print(f"\n[recipe] {name}: {line}", flush=True)
        started = time.perf_counter()
        with self.log.open("a", encoding="utf-8") as handle:
            handle.write(f"\n$ {line}\n")
            handle.flush()
            argv_text = list(map(str, argv))
            code = subprocess.run(argv_text, check=False, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
        seconds = time.perf_counter() - started
        self.steps.append({"step": name, "command": line, "seconds": round(seconds, 1), "exit": code})
        if code != 0:
            tail = "".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-30:])
            raise SystemExit(f"[recipe] {name} failed (exit {code}); last lines of {self.log}:\n{tail}")
        print(f"[recipe] {name}: done in {seconds:.0f} s", flush=True)
        return seconds


def tool(name: str) -> str:
    """An app's console script next to this interpreter (the recipe's venv), so the commands run in it."""
    return str(Path(sys.executable).parent / name)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_report(
    out: Path,
    title: str,
    *,
    scores: Mapping[str, Mapping[str, list[float]]],
    comparisons: Mapping[str, tuple[str, str, str]],
    runner: Runner,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """report.json, report.md and points.png from per-row scores {point: {metric: [row scores]}}.

    `comparisons` names each interval: {label: (metric, before point, after point)}.
    """
    means = {p: {m: float(np.mean(v)) for m, v in per.items()} for p, per in scores.items()}
    intervals = {
        label: asdict(paired_bootstrap(scores[a][m], scores[b][m])) for label, (m, a, b) in comparisons.items()
    }
    report = {
        "title": title,
        "means": means,
        "intervals": intervals,
        "commands": runner.steps,
        "wall_s": round(sum(s["seconds"] for s in runner.steps), 1),
        **extra,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    metrics = list(next(iter(scores.values())))
    lines = [f"# {title}", "", "| point | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    lines += [f"| {p} | " + " | ".join(f"{means[p][m]:.3f}" for m in metrics) + " |" for p in means]
    lines += ["", "| difference | mean | 95% paired bootstrap |", "|---|---|---|"]
    lines += [f"| {k} | {v['mean']:+.3f} | [{v['low']:+.3f}, {v['high']:+.3f}] |" for k, v in intervals.items()]
    lines += ["", f"wall: {report['wall_s']:.0f} s", "", "```"] + [s["command"] for s in runner.steps] + ["```", ""]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    plot_points(out / "points.png", title, means)
    print("\n".join(lines), flush=True)
    return report


def plot_points(path: Path, title: str, means: Mapping[str, Mapping[str, float]]) -> None:
    """One panel per metric, its held-out mean at each point; skipped with a note when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[recipe] matplotlib not installed: no points.png", flush=True)
        return
    points = list(means)
    metrics = list(next(iter(means.values())))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        ax.plot(points, [means[p][metric] for p in points], marker="o")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
