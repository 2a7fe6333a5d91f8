"""Reward against samples trained (issue 42): does a mode that trains on older samples learn as much per trained
sample as sync? Each run is a list of steps (samples the update trained on, the batch's mean reward).

A run's curve is a step function of cumulative trained samples: a step that trained k samples at mean reward r
counts r for each of its k samples. A window [a, b] of cumulative samples averages over the samples trained in it
(a step straddling an edge counts the share inside). A step that skipped its update (dynamic sampling found no
group with signal) trained 0 samples and weighs nothing. The windows are the quarters of the smallest final count
over all runs compared, so every run covers every window.

Two rewards per step: the trained batch's `reward/mean` (with dynamic sampling that is the groups kept, and the
modes keep differently: sync trains only groups whose samples differ, async fills its batch with groups as they
are once its drop budget is spent), and the sampled reward: every scored sample, kept or dropped, grouped by the
policy version that sampled it (`VersionedRewards`; a sample spanning an in-flight update counts for the version
it started under). For the latter the step that trained on samples k-1 -> k is given the reward of the policy it
updated (the weights of the last step before it that updated): the policy's own reward against what it had been
trained on, whatever filtering chose.

"Within noise" of sync at a window: |median over seeds of the mode's window mean - sync's median| <= sync's own
seed-to-seed range there (max - min over its seeds), i.e. the gap is no larger than what sync alone shows between
seeds. A mode is within noise of sync if it is at every window; with fewer than 2 seeds nothing is judged.
Not a benchmark itself: `nox -s bench` skips files whose name starts with `_`.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Step = tuple[float, float]
"""(samples trained at the step, the step's mean reward)."""


class VersionedRewards:
    """A reward function that records each scored sample's reward under the policy version that sampled it."""

    def __init__(self, reward_fn: Callable[[Sequence[Any]], list[Any]]) -> None:
        self.reward_fn = reward_fn
        self.by_version: dict[int, list[float]] = {}
        self.lock = threading.Lock()  # async mode scores groups on threads of their own

    def __call__(self, trajectories: Sequence[Any]) -> list[Any]:
        outputs = self.reward_fn(trajectories)
        with self.lock:
            for traj, out in zip(trajectories, outputs, strict=True):
                version = min(traj.policy_versions) if traj.policy_versions else 0
                self.by_version.setdefault(int(version), []).append(float(out.score))
        return outputs

    def means(self) -> dict[int, float]:
        return {v: sum(r) / len(r) for v, r in sorted(self.by_version.items())}


def sampled_steps(trained: Sequence[float], version_means: Mapping[int, float]) -> list[Step]:
    """Per step k (1-based), (samples trained at k, sampled reward of the policy that step updated): the weights of
    the last step before k that trained anything (0: the start), else the nearest earlier version that sampled."""
    out, policy = [], 0
    for k, samples in enumerate(trained, start=1):
        known = [v for v in version_means if v <= policy]
        if not known:
            raise ValueError(f"no sample was scored under policy version {policy} or earlier")
        out.append((samples, version_means[max(known)]))
        if samples > 0:
            policy = k
    return out


def window_mean(steps: Sequence[Step], low: float, high: float) -> float:
    """Mean reward of the samples trained between cumulative counts `low` and `high` (sample-weighted)."""
    if not 0 <= low < high:
        raise ValueError(f"window [{low}, {high}]: need 0 <= low < high")
    total = weight = start = 0.0
    for samples, reward in steps:
        if samples < 0:
            raise ValueError(f"a step trained {samples} samples; counts are >= 0")
        end = start + samples
        overlap = max(0.0, min(end, high) - max(start, low))
        total, weight, start = total + overlap * reward, weight + overlap, end
    if start < high:
        raise ValueError(f"window [{low:g}, {high:g}] runs past the run's {start:g} trained samples")
    return total / weight


def windows(final_counts: Sequence[float], parts: int = 4) -> list[tuple[float, float]]:
    """`parts` equal windows of [0, the smallest final count]."""
    smallest = min(final_counts)
    if smallest <= 0:
        raise ValueError("a run trained no samples at all: there is no window to compare")
    return [(smallest * i / parts, smallest * (i + 1) / parts) for i in range(parts)]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def compare(runs: Mapping[str, Sequence[Sequence[Step]]], parts: int = 4, peer: str = "sync") -> dict[str, Any]:
    """Per mode (its runs in seed order, paired with `peer`'s by position): window means per seed, their spread,
    the per-seed difference to `peer` and the noise verdict (module docstring)."""
    bounds = windows([sum(s for s, _ in run) for rs in runs.values() for run in rs], parts)
    means = {name: [[window_mean(run, a, b) for a, b in bounds] for run in rs] for name, rs in runs.items()}
    out: dict[str, Any] = {"windows": bounds, "peer": peer, "modes": {}}
    base = means.get(peer)
    for name, per_seed in means.items():
        cells = []
        for w in range(len(bounds)):
            values = [seed[w] for seed in per_seed]
            cell: dict[str, Any] = {"per_seed": values, **spread(values)}
            if base is not None and name != peer:
                peers = [seed[w] for seed in base]
                cell["minus_peer"] = spread([v - p for v, p in zip(values, peers, strict=True)])
                gap, noise = abs(statistics.median(values) - statistics.median(peers)), max(peers) - min(peers)
                cell["gap"], cell["noise"] = gap, noise
                cell["within_noise"] = gap <= noise if len(peers) > 1 else None
            cells.append(cell)
        verdicts = [c.get("within_noise") for c in cells]
        within = None if base is None or name == peer or None in verdicts else all(verdicts)
        out["modes"][name] = {"windows": cells, "within_noise": within}
    return out


def table(result: Mapping[str, Any], reward: str = "reward") -> list[str]:
    """The comparison as markdown lines: one row per (mode, window), then a verdict line per mode."""
    peer = result["peer"]
    lines = [
        f"| mode | trained samples | {reward}: median [min, max] over seeds | - {peer}'s, per seed: median [min, max] "
        f"| gap of medians | {peer}'s seed range (noise) | within noise |",
        "|---|---|---|---|---|---|---|",
    ]
    fmt = lambda s: f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"  # noqa: E731
    for name, mode in result["modes"].items():
        for (a, b), cell in zip(result["windows"], mode["windows"], strict=True):
            diff = fmt(cell["minus_peer"]) if "minus_peer" in cell else "-"
            gap = f"{cell['gap']:.3f}" if "gap" in cell else "-"
            noise = f"{cell['noise']:.3f}" if "noise" in cell else "-"
            verdict = {True: "yes", False: "no", None: "-"}[cell.get("within_noise")]
            lines.append(f"| {name} | {a:.0f}-{b:.0f} | {fmt(cell)} | {diff} | {gap} | {noise} | {verdict} |")
    for name, mode in result["modes"].items():
        if name == peer:
            continue
        verdict = mode["within_noise"]
        said = "not judged (needs >= 2 seeds and the peer)" if verdict is None else ("yes" if verdict else "no")
        lines.append(f"{name} within noise of {peer} at every window ({reward}): {said}")
    return lines
