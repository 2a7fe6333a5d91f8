"""The peer adapters without their peers: importing them pulls in no torch and no peer library, and their
calling conventions hold as plain functions (the real-library tests are tests/adapters, `nox -s tests-adapters`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from rlloom.rewards.integrations.trl import trl_reward
from rlloom.rewards.integrations.verl import compute_score


def test_adapters_import_no_torch_and_no_peer() -> None:
    code = (
        "import sys\n"
        "import rlloom.rewards.integrations.trl, rlloom.rewards.integrations.verl\n"
        "import rlloom.rewards.integrations.verifiers\n"
        "print(sorted(m for m in ('torch', 'trl', 'verl', 'verifiers', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_verl_compute_score_routes_by_data_source_and_kwargs() -> None:
    assert compute_score("openai/gsm8k", "#### 4", "4") == 1.0
    assert compute_score("searchR1_nq", "<answer>Paris</answer>", {"target": ["paris"]}, {}) == 1.0
    assert compute_score("anything", "<answer>Paris</answer>", ["Paris"], scorer="qa_em") == 1.0
    assert compute_score("nq", "<answer>Paris</answer>", ["Paris"], scorers={"nq": "qa_f1"}, components=True) == {
        "score": 1.0,
        "em": 1.0,
        "f1": 1.0,
        "sub_em": 1.0,
    }
    # keywords some veRL reward managers add are accepted and ignored
    assert compute_score("gsm8k", "#### 4", "4", None, reward_router_address=None, memory_limit_mb=1024) == 1.0


def test_trl_reward_plain_call() -> None:
    reward = trl_reward("gsm8k")
    assert reward.__name__ == "rlloom_gsm8k"
    assert reward(["q", "q"], ["\\boxed{4}", "\\boxed{3}"], ground_truth=["4", "4"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        reward(["q", "q"], ["\\boxed{4}"], ground_truth=["4"])


def test_trl_reward_runs_an_async_scorers_batch_concurrently() -> None:
    """An async scorer (an LLM judge) gets the whole batch in flight at once, not one request after another."""
    in_flight, peak = 0, 0

    async def judge(response: str, ground_truth: str, *, extra_info: object = None) -> float:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return float(response == ground_truth)

    reward = trl_reward(judge)
    assert reward(["q"] * 4, ["a", "b", "a", "c"], ground_truth=["a"] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert peak == 4
