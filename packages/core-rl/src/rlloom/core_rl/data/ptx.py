"""PPO-ptx rows (`algorithm.ptx`): pretraining text, or (prompt, response) pairs rendered as the rollout engine
renders prompts, read from `algorithm.ptx.files` and turned into trajectories whose trained tokens are the ones the
language-model loss covers (`workers.supervised.supervised_nll_sum` is that loss).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlloom.core_rl.config.algorithm import PtxConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.generation import GenerationRequest
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import PromptLoader
from rlloom.core_rl.data.rows import DataError, read_jsonl

PTX_ROW_SHAPES = "{text: ...} (pretraining text) or {prompt: chat messages or a string, response: ...} (an SFT pair)"


def ptx_row_problem(row: Any) -> str | None:
    """Why `row` cannot be a PPO-ptx row (None when it can): it needs non-empty `text`, or `prompt` and `response`."""
    if not isinstance(row, Mapping):
        return f"the row is a {type(row).__name__}, not a mapping of fields"
    if "text" in row:
        text = row["text"]
        return None if isinstance(text, str) and text else "`text` is not a non-empty string"
    prompt, response = row.get("prompt"), row.get("response")
    if prompt is None or response is None:
        return (
            f"the row has neither `text` nor `prompt` and `response` (its fields: {', '.join(sorted(map(str, row)))})"
        )
    if not isinstance(response, str) or not response:
        return "`response` is not a non-empty string"
    if isinstance(prompt, str):
        return None if prompt else "`prompt` is an empty string"
    if isinstance(prompt, Sequence) and prompt and all(isinstance(m, Mapping) and "role" in m for m in prompt):
        return None
    return "`prompt` is neither a string nor a list of chat messages"


def read_ptx_rows(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of every `algorithm.ptx.files` file in order, each checked (`file:line` names the first bad one)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        if not Path(path).is_file():
            raise DataError(f"algorithm.ptx.files: {path} does not exist (or is not a file)")
        part = read_jsonl(path)
        for index, row in enumerate(part):
            problem = ptx_row_problem(row)
            if problem is not None:
                raise DataError(f"{part.where(index)}: {problem}; each algorithm.ptx.files row needs {PTX_ROW_SHAPES}")
        rows.extend(part)
    if not rows:
        raise DataError(f"algorithm.ptx.files {list(paths)} hold no rows; PPO-ptx needs at least one")
    return rows


def ptx_trajectory(
    tokenizer: Any, row: Mapping[str, Any], *, max_length: int, chat_template_kwargs: Mapping[str, Any] | None = None
) -> Trajectory:
    """One PPO-ptx row as a trajectory whose trained (loss-mask-1) tokens are the ones the LM loss covers.

    `{text}`: the text's tokens (with the tokenizer's own BOS, if it adds one) and EOS; the first token is the
    "prompt", every later one is trained, as a pretraining loss over the whole sequence. `{prompt, response}`: the
    prompt rendered with the chat template as the rollout engine renders it (a string is one user message), then the
    response and EOS, trained, as the SFT warm-up does. Cut to `max_length` tokens in all, prompt included.
    """
    problem = ptx_row_problem(row)
    if problem is not None:
        raise DataError(f"PPO-ptx row: {problem}; each row needs {PTX_ROW_SHAPES}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError("PPO-ptx: the tokenizer has no eos_token_id to end the trained text with")
    if "text" in row:
        ids = [*tokenizer(row["text"])["input_ids"], int(eos)][:max_length]
        return Trajectory(prompt_ids=ids[:1], response_ids=ids[1:], loss_mask=[1] * (len(ids) - 1))
    prompt = row["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    prompt_ids = render_prompt(
        tokenizer, GenerationRequest(messages=messages, chat_template_kwargs=dict(chat_template_kwargs or {}))
    )
    room = max_length - len(prompt_ids)
    if room < 1:
        raise DataError(
            f"PPO-ptx row: the prompt is {len(prompt_ids)} tokens, leaving no room for the response within "
            f"algorithm.ptx.max_length={max_length}; raise the limit or shorten the prompt"
        )
    response = [*tokenizer(row["response"], add_special_tokens=False)["input_ids"], int(eos)][:room]
    return Trajectory(prompt_ids=prompt_ids, response_ids=response, loss_mask=[1] * len(response))


def next_ptx_batch(
    loader: PromptLoader,
    tokenizer: Any,
    pad_token_id: int,
    ptx: PtxConfig,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> TrajectoryBatch:
    """The next `algorithm.ptx.batch_size` PPO-ptx rows of `loader` as a batch; the loader's position is checkpointed,
    so a resumed run continues with the rows an uninterrupted one would have drawn."""
    trajectories = [
        ptx_trajectory(tokenizer, row, max_length=ptx.max_length, chat_template_kwargs=chat_template_kwargs)
        for row in loader.next_batch()
    ]
    return TrajectoryBatch.from_trajectories(trajectories, pad_token_id)
