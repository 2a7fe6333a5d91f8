"""Format demonstrations built from real rows, for a supervised warm-up before RL.

A model that never writes `\\boxed{}` earns no reward, so rejection sampling from it keeps nothing; GSM8K and
MATH-500 ship worked solutions, so each demonstration is the row's own reasoning followed by its final answer in
`\\boxed{...}`, the form the reward reads (see `INSTRUCTION` in data.py). Torch-free on purpose.
"""

from __future__ import annotations

from typing import Any


class DemonstrationError(ValueError):
    """No row carries the solution a demonstration needs."""


def demonstration(row: dict[str, Any]) -> tuple[list[dict[str, str]], str] | None:
    """(prompt messages, target text) for one row, or None when it has no `extra_info.solution`."""
    solution = (row.get("extra_info") or {}).get("solution")
    if not isinstance(solution, str) or not solution.strip():
        return None
    answer = str(row["reward_model"]["ground_truth"])
    return list(row["prompt"]), f"{solution.strip()}\nThe final answer is \\boxed{{{answer}}}."


def demonstrations(rows: list[dict[str, Any]]) -> tuple[list[tuple[list[dict[str, str]], str]], int]:
    """All demonstrations and the count of rows skipped for lack of a solution; an error when none has one."""
    built = [d for d in (demonstration(r) for r in rows) if d is not None]
    if not built:
        raise DemonstrationError(
            f"none of the {len(rows)} rows has extra_info.solution; re-run `reasoning prepare-data` on a dataset "
            "that ships worked solutions (gsm8k, math500)"
        )
    return built, len(rows) - len(built)
