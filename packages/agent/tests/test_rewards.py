"""AgentRubric: outcome, format and tool-use terms, reported whatever happens to the outcome scorer."""

from __future__ import annotations

from typing import Any

import pytest

from rlloom.agent.rewards import AgentRubric, EpisodeSummary

EPISODE = EpisodeSummary(
    model_text="<answer>5</answer>",
    ground_truth="5",
    extra_info={},
    turns_well_formed=3,
    turns=4,
    tool_calls=4,
    tool_errors=1,
)


def test_all_components_are_reported() -> None:
    out = AgentRubric(lambda r, g, extra_info=None: 1.0, format_weight=0.5, tool_use_weight=0.2).score(EPISODE)
    assert out.components == {"outcome": 1.0, "format": 0.75, "tool_use": 0.75}
    assert out.score == pytest.approx(1.0 + 0.5 * 0.75 + 0.2 * 0.75)


def test_a_crashing_outcome_still_reports_format_and_tool_use() -> None:
    def broken(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
        raise RuntimeError("scorer broke")

    out = AgentRubric(broken, format_weight=0.5, tool_use_weight=0.2).score(EPISODE)
    assert out.components == {"outcome": 0.0, "format": 0.75, "tool_use": 0.75}
    assert out.score == 0.0  # format and tool use are not rewarded on their own
    assert out.error == "RuntimeError: scorer broke"
