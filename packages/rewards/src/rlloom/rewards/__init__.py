"""rlloom.rewards: verifiable rewards for RL post-training (math, QA, code, format, LLM judge) with safe batch scoring.

Names are imported on first use (PEP 562 `__getattr__`), so `import rlloom.rewards` stays fast and never
imports SymPy, Math-Verify or the code sandbox; `rlloom.rewards.math` and `rlloom.rewards.code` load only when
touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlloom.rewards.__about__ import __version__
from rlloom.rewards.types import Scorer, ScoreResult, as_result

_EXPORTS = {
    "normalize_answer": "qa", "exact_match": "qa", "f1": "qa", "substring_match": "qa",
    "qa_em_scorer": "qa", "qa_f1_scorer": "qa", "qa_substring_scorer": "qa", "extract_tagged_answer": "qa",
    "FormatCheck": "format", "r1_format": "format", "search_r1_sequence": "format",
    "search_r1_format_reward": "format", "tool_call_format": "format", "overlong_penalty": "format",
    "kimi_length_rewards": "format",
    "JudgeConfig": "judge", "LLMJudge": "judge", "parse_verdict": "judge",
    "RemoteReward": "remote", "RemoteRewardConfig": "remote", "RemoteRewardError": "remote", "RemoteSample": "remote",
    "Rubric": "rubric", "RubricTerm": "rubric",
    "DEFAULT_SCORERS": "registry", "get_scorer": "registry", "load_function": "registry", "register": "registry",
    "ScorerLoadError": "registry",
    "ScoreItem": "batch", "ScoringPool": "batch", "score_batch": "batch", "ascore_batch": "batch",
}  # fmt: skip
_SUBPACKAGES = ("math", "code", "qa", "format", "judge", "remote", "rubric", "registry", "batch", "cli")

if TYPE_CHECKING:
    from rlloom.rewards.batch import ScoreItem, ScoringPool, ascore_batch, score_batch
    from rlloom.rewards.format import (
        FormatCheck,
        kimi_length_rewards,
        overlong_penalty,
        r1_format,
        search_r1_format_reward,
        search_r1_sequence,
        tool_call_format,
    )
    from rlloom.rewards.judge import JudgeConfig, LLMJudge, parse_verdict
    from rlloom.rewards.qa import (
        exact_match,
        extract_tagged_answer,
        f1,
        normalize_answer,
        qa_em_scorer,
        qa_f1_scorer,
        qa_substring_scorer,
        substring_match,
    )
    from rlloom.rewards.registry import DEFAULT_SCORERS, ScorerLoadError, get_scorer, load_function, register
    from rlloom.rewards.remote import RemoteReward, RemoteRewardConfig, RemoteRewardError, RemoteSample
    from rlloom.rewards.rubric import Rubric, RubricTerm


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"rlloom.rewards.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"rlloom.rewards.{name}")
    raise AttributeError(f"module 'rlloom.rewards' has no attribute {name!r}")


__all__ = [
    "DEFAULT_SCORERS",
    "FormatCheck",
    "JudgeConfig",
    "LLMJudge",
    "RemoteReward",
    "RemoteRewardConfig",
    "RemoteRewardError",
    "RemoteSample",
    "Rubric",
    "RubricTerm",
    "ScoreItem",
    "ScoreResult",
    "Scorer",
    "ScorerLoadError",
    "ScoringPool",
    "__version__",
    "as_result",
    "ascore_batch",
    "exact_match",
    "extract_tagged_answer",
    "f1",
    "get_scorer",
    "kimi_length_rewards",
    "load_function",
    "normalize_answer",
    "overlong_penalty",
    "parse_verdict",
    "qa_em_scorer",
    "qa_f1_scorer",
    "qa_substring_scorer",
    "r1_format",
    "register",
    "score_batch",
    "search_r1_format_reward",
    "search_r1_sequence",
    "substring_match",
    "tool_call_format",
]
