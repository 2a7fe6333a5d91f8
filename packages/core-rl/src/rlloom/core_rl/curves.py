"""Reward curves of a run, read from the trainer's metrics.jsonl and drawn as a PNG or in ASCII.

matplotlib is optional (not a dependency): with it `save_plot` writes a PNG, without it callers fall back to
`ascii_curve` in the terminal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

Curve = list[tuple[int, float]]
ASCII_HEIGHT = 8


def read_curves(metrics_path: Path, key: str = "reward/mean") -> tuple[Curve, Curve]:
    """(step, held-out value) and (step, training value) of `key` (held-out: `val/<key>`) from metrics.jsonl."""
    val: Curve = []
    train: Curve = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if f"val/{key}" in record:
            val.append((int(record["step"]), float(record[f"val/{key}"])))
        if key in record:
            train.append((int(record["step"]), float(record[key])))
    return val, train


def ascii_curve(points: Sequence[tuple[int, float]], height: int = ASCII_HEIGHT) -> str:
    """A column per point, rows from 1.0 (top) down to 0.0, `#` up to each value."""
    if not points:
        return "(no points)"
    lines = []
    for level in range(height, 0, -1):
        threshold = (level - 0.5) / height
        label = f"{level / height:4.2f} |" if level in (height, height // 2) else "     |"
        lines.append(label + "".join(" # " if value >= threshold else "   " for _, value in points))
    lines.append("     +" + "---" * len(points))
    lines.append("step  " + "".join(f"{step:^3d}" for step, _ in points))
    return "\n".join(lines)


def save_plot(
    val_curve: Sequence[tuple[int, float]],
    train_curve: Sequence[tuple[int, float]],
    path: Path,
    *,
    title: str,
    ylabel: str = "reward",
) -> Path | None:
    """A PNG of the held-out and training curves per step; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if train_curve:
        ax.plot(*zip(*train_curve, strict=True), color="0.6", linewidth=1, label=f"training {ylabel} (sampled)")
    ax.plot(*zip(*val_curve, strict=True), marker="o", label=f"held-out {ylabel} (greedy)")
    ax.set(xlabel="step", ylabel=ylabel, ylim=(0, 1.02), title=title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_or_draw(
    val_curve: Sequence[tuple[int, float]],
    train_curve: Sequence[tuple[int, float]],
    path: Path,
    *,
    title: str,
    ylabel: str = "reward",
) -> str:
    """What a demo prints about its curve: where the PNG went, or (without matplotlib) the held-out curve in ASCII."""
    plot = save_plot(val_curve, train_curve, path, title=title, ylabel=ylabel)
    if plot is not None:
        return f"{ylabel} curve: {plot}"
    return f"held-out {ylabel} per validation (install matplotlib for a PNG):\n{ascii_curve(val_curve)}"
