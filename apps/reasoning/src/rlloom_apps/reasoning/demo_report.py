"""The demo's closing report: the held-out before/after table (the curves are drawn by
rlloom.core_rl.observe.curves)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlloom_apps.reasoning.demo import DemoResult


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
