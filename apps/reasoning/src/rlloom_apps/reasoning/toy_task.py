"""The demo's verifiable task: reverse a short digit string ("reverse 482" -> "284"), its reward and its split.

A 0.1M-parameter character model can learn it on a CPU (it is pure attention: copy the right position), and the
answer is a number, so the real math scorer from rlloom.rewards checks it: the demo goes through the same reward
path as a GSM8K run. The reward is an rlloom.rewards `Rubric`: half for the exact answer (math scorer), half
for the share of digits in the right place, so a sample with two of three digits right beats one with none and
GRPO gets a signal from groups where nobody is exactly right yet. Digits 1-9 only, so no answer has a leading
zero. The split is over strings, so held-out prompts are never seen in warm-up or GRPO.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from typing import Any

from rlloom.rewards.math import math_scorer
from rlloom.rewards.rubric import Rubric
from rlloom.rewards.types import ScoreResult

DATA_SOURCE = "toy_reverse"
DIGITS = "123456789"


def reverse_row(digits: str) -> dict[str, Any]:
    """One row in the veRL shape the trainer reads."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"reverse {digits}"}],
        "reward_model": {"style": "rule", "ground_truth": digits[::-1]},
    }


def reverse_splits(
    length: int = 3, held_out: int = 64, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every `length`-digit string over 1-9, shuffled with `seed`: (train rows, `held_out` held-out rows)."""
    total = len(DIGITS) ** length
    if length < 1 or not 1 <= held_out < total:
        raise ValueError(
            f"length={length} gives {total} strings; held_out={held_out} must be between 1 and {total - 1}"
        )
    strings = ["".join(chars) for chars in itertools.product(DIGITS, repeat=length)]
    random.Random(seed).shuffle(strings)
    rows = [reverse_row(s) for s in strings]
    return rows[held_out:], rows[:held_out]


def answer_of(row: dict[str, Any]) -> str:
    return str(row["reward_model"]["ground_truth"])


def digits_in_place(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """Share of the answer's digits that the response has at the same position (a rlloom.rewards Scorer).

    Divided by the longer of the two strings, so extra characters cost as much as missing ones.
    """
    answer, gold = response.strip(), str(ground_truth).strip()
    if not gold:
        return ScoreResult(score=0.0, error="ground_truth is empty; every reversal row needs its reversed digits")
    hits = sum(a == b for a, b in zip(answer, gold, strict=False))
    return ScoreResult(score=hits / max(len(answer), len(gold)), extracted=answer)


def reversal_rubric() -> Rubric:
    """score = 0.5 * exact (rlloom.rewards' math scorer) + 0.5 * digits in place; both logged as components."""
    return Rubric([("exact", math_scorer, 0.5), ("digits", digits_in_place, 0.5)])
