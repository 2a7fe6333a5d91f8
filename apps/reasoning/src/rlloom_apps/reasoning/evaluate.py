"""`reasoning eval`: sample n responses per problem, score them, report avg@n, pass@k and maj@k per dataset.

Wiring only: the engine comes from `rlloom.rollout.policy_spec` (a model folder through HF transformers or vLLM,
or an OpenAI-compatible server); sampling, scoring, the metrics and the output files are
`rlloom.rewards.eval_runner`'s. Each row's chat messages are the request; problem i samples with seed + i.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlloom.core_rl.contracts import GenerationRequest
from rlloom.rewards.eval_runner import (
    AsyncSampler,
    EvalResult,
    EvalSettings,
    RequestFor,
    default_ks,
    summary_text,
    write_outputs,
)
from rlloom.rewards.eval_runner import (
    run_eval as run_rows,
)
from rlloom.rollout import eval_sampling


def text_request(settings: EvalSettings) -> RequestFor:
    """Row i's chat messages, sampled with seed + i."""

    def request_for(index: int, row: Mapping[str, Any]) -> GenerationRequest:
        return GenerationRequest(
            messages=list(row["prompt"]),
            sampling=eval_sampling(settings, index),
            chat_template_kwargs=dict(settings.chat_template_kwargs),
        )

    return request_for


def run_eval(
    engine: AsyncSampler, rows: Sequence[Mapping[str, Any]], settings: EvalSettings, *, progress: bool = True
) -> EvalResult:
    """Sample every row n times, score every sample, summarize per data source."""
    for i, row in enumerate(rows):
        if not isinstance(row.get("prompt"), list) or not row["prompt"]:
            raise ValueError(
                f"row {i} has no 'prompt' list of chat messages; prepare rows with `reasoning prepare-data`"
            )
    return run_rows(engine, rows, settings, text_request(settings), progress=progress)


__all__ = ["EvalResult", "EvalSettings", "default_ks", "run_eval", "summary_text", "text_request", "write_outputs"]
