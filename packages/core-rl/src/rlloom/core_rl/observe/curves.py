"""Reward curves of a run, read from the trainer's metrics.jsonl and drawn as a PNG or in ASCII.

matplotlib is optional (not a dependency): with it `save_plot` writes a PNG, without it callers fall back to
`ascii_curve` in the terminal.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


RUN_PANELS: dict[str, tuple[str, ...]] = {
    "reward": ("reward/mean", "val/reward/mean"),
    "response length (tokens)": ("response_length/mean", "val/response_length/mean"),
    "KL to the reference": ("actor/kl_mean", "actor/kl_loss"),
    "entropy": ("actor/entropy",),
    "searches per sample": ("rollout/searches/mean", "val/rollout/searches/mean"),
}
"""The panels a run's plot has, each with the metrics.jsonl keys it draws (one line per key a run logged)."""


def read_run_series(metrics_path: Path) -> dict[str, dict[str, Curve]]:
    """Panel title -> {key: (step, value) points} for every RUN_PANELS key the run logged; panels with none are
    left out. A line cut short (an interrupted run) is skipped."""
    panels: dict[str, dict[str, Curve]] = {}
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        for title, keys in RUN_PANELS.items():
            for key in keys:
                value = record.get(key)
                if isinstance(value, int | float) and "step" in record:
                    panels.setdefault(title, {}).setdefault(key, []).append((int(record["step"]), float(value)))
    return panels


def save_run_plot(metrics_path: Path, path: Path, *, title: str) -> list[str]:
    """A PNG with one panel per RUN_PANELS entry the run logged; returns the panels drawn. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = read_run_series(metrics_path)
    if not panels:
        raise ValueError(f"{metrics_path} has none of the keys plotted ({', '.join(RUN_PANELS)})")
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.4 * len(panels)), sharex=True, squeeze=False)
    for ax, (panel, series) in zip(axes[:, 0], panels.items(), strict=True):
        for key, points in series.items():
            held_out = key.startswith("val/")
            ax.plot(*zip(*points, strict=True), marker="o" if held_out else None, label=key, linewidth=1)
        ax.set_ylabel(panel)
        ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return list(panels)


def add_plot_command(commands: Any, prog: str) -> None:
    """A `plot RUN_DIR` subparser: the run's curves from its metrics.jsonl to a PNG."""
    plot = commands.add_parser(
        "plot",
        help="draw a run's curves (reward, length, KL, entropy, searches) from its metrics.jsonl to a PNG",
        description=f"Reads RUN_DIR/metrics.jsonl (written by `{prog} train` and `demo`) and writes one panel per "
        "logged series. Works while the run is still going.",
    )
    plot.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run folder (trainer.output_dir)")
    plot.add_argument("--out", type=Path, default=None, help="PNG path (default: RUN_DIR/curves.png)")


def run_plot_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`plot`: refusals name the flag; prints the PNG's path and the panels drawn."""
    metrics = args.run_dir / "metrics.jsonl"
    if not metrics.is_file():
        parser.error(f"RUN_DIR {args.run_dir} has no metrics.jsonl; give a run folder (trainer.output_dir)")
    out = args.out if args.out is not None else args.run_dir / "curves.png"
    if out.is_dir():
        parser.error(f"--out {out} is a folder; give a file path, e.g. {out / 'curves.png'}")
    try:
        drawn = save_run_plot(metrics, out, title=args.run_dir.resolve().name)
    except ImportError:
        parser.error("plot needs matplotlib: pip install matplotlib (or 'rlloom-core-rl[plot]')")
    except ValueError as err:
        parser.error(str(err))
    print(f"wrote {out} ({', '.join(drawn)})")
