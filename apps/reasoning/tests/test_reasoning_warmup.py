"""Warm-up demonstrations come from the rows' own solutions and end in the boxed answer the reward reads."""

from __future__ import annotations

import pytest
from rlloom_apps.reasoning.data import to_row
from rlloom_apps.reasoning.warmup_rows import DemonstrationError, demonstrations


def test_gsm8k_row_becomes_reasoning_then_boxed_answer() -> None:
    row = to_row("gsm8k", {"question": "What is 2+3?", "answer": "2 + 3 = 5\n#### 5"}, 0, "train")
    [(messages, target)], skipped = demonstrations([row])
    assert skipped == 0
    assert messages == row["prompt"]
    assert target == "2 + 3 = 5\nThe final answer is \\boxed{5}."


def test_rows_without_solution_are_skipped_and_counted() -> None:
    with_solution = to_row("math500", {"problem": "1+1?", "answer": "2", "solution": "1+1=2"}, 0, "test")
    without = to_row("math500", {"problem": "2+2?", "answer": "4"}, 1, "test")
    built, skipped = demonstrations([with_solution, without])
    assert (len(built), skipped) == (1, 1)


def test_no_solution_anywhere_names_the_field() -> None:
    row = to_row("aime24", {"problem": "x?", "answer": "7"}, 0, "test")
    with pytest.raises(DemonstrationError, match="extra_info.solution"):
        demonstrations([row])
