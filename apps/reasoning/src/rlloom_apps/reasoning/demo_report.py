"""The demo's closing report: the held-out before/after table, and the reward curve as a PNG or in ASCII.

matplotlib is optional (not a dependency of the app): with it the curve is saved as reward_curve.png in the run
folder, without it the curve is drawn in the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlloom_apps.reasoning.demo import DemoResult

ASCII_HEIGHT = 8


def before_after_table(result: DemoResult) -> str:
    """Markdown table of the held-out scores (greedy) of the untrained, warmed-up and GRPO-trained model."""
    rows = [
        ("untrained", result.untrained),
        (f"after warm-up ({result.warmup_steps} steps) = before GRPO", result.before),
        (f"after GRPO ({result.train_curve[-1][0] if result.train_curve else 0} steps)", result.after),
    ]
    lines = [
        "| held-out model (greedy) | exact answers | digits in place | reward (rubric) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {s.exact:.2f} | {s.digits:.2f} | {s.reward:.2f} |" for name, s in rows]
    gain = result.after.exact - result.before.exact
    lines.append(f"\nGRPO changed held-out exact answers by {gain:+.2f} ({result.seconds:.0f} s in all).")
    return "\n".join(lines)


def ascii_curve(points: Sequence[tuple[int, float]], height: int = ASCII_HEIGHT) -> str:
    """A column per point, rows from reward 1.0 (top) down to 0.0, `#` up to each value."""
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
    val_curve: Sequence[tuple[int, float]], train_curve: Sequence[tuple[int, float]], path: Path
) -> Path | None:
    """reward_curve.png with held-out and training reward per step; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if train_curve:
        ax.plot(*zip(*train_curve, strict=True), color="0.6", linewidth=1, label="training reward (sampled)")
    ax.plot(*zip(*val_curve, strict=True), marker="o", label="held-out reward (greedy)")
    ax.set(xlabel="GRPO step", ylabel="reward", ylim=(0, 1.02), title="rlloom demo: GRPO on digit reversal")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
