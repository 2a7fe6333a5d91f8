"""Supervised steps on trajectories through the actor's own forward (a warm-up before RL).

RL on a tiny or untrained model has no signal until some samples succeed; a little cross-entropy on
demonstrations gives it a start. The loss goes through `model_forward.response_logprobs`, the forward the policy
loss uses, so whatever the actor supports, this does too: padded text rows, and vision-language rows with their
own image inputs and M-RoPE positions (`Trajectory.multimodal`). Only loss-mask-1 response tokens are trained,
so the same call warms up a single-turn answer (mask all 1) or an agent conversation (observations and template
glue mask 0), and the prompt's logits are never computed (`logits_to_keep`).

PPO-ptx (`algorithm.ptx`) trains the same loss during RL on rows of `algorithm.ptx.files`, turned into trajectories
by `ptx_trajectory`: pretraining text, or (prompt, response) pairs rendered as the rollout engine renders prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from rlloom.core_rl.config.algorithm import PtxConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.generation import GenerationRequest
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import PromptLoader
from rlloom.core_rl.data.rows import DataError, read_jsonl
from rlloom.core_rl.workers.forward import response_logprobs


def supervised_nll_sum(model: nn.Module, batch: TrajectoryBatch, *, packed: bool = False) -> torch.Tensor:
    """Σ −log p of the loss-mask-1 response tokens of `batch` (on the model's device); callers divide by the token
    count of the whole batch, so micro-batches of one batch add up to its mean."""
    logprobs, _ = response_logprobs(model, batch, packed=packed)
    return -(logprobs * batch.loss_mask.to(logprobs.dtype)).sum()


def supervised_loss(model: nn.Module, trajectories: Sequence[Trajectory], *, pad_token_id: int) -> torch.Tensor:
    """Mean negative log-likelihood of the loss-mask-1 response tokens, over all such tokens of the batch."""
    batch = TrajectoryBatch.from_trajectories(list(trajectories), pad_token_id)
    device = next(model.parameters()).device
    batch = batch.to(device)
    tokens = batch.loss_mask.sum()
    if float(tokens) == 0:
        raise ValueError("supervised_loss: no response token has loss mask 1; nothing to learn from")
    return supervised_nll_sum(model, batch) / tokens


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


def supervised_train(
    model: nn.Module,
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    stop: Callable[[int], bool] | None = None,
    check_every: int = 20,
    progress: bool = True,
) -> list[float]:
    """AdamW steps on random batches of `trajectories`; returns the losses.

    Batches are drawn from the trajectories that have a loss-mask-1 token (one with none adds no loss). `stop(step)`
    is asked every `check_every` steps, with the model in eval mode, and ends training when it returns True (e.g.
    "the model already answers 30% of the training prompts": stopping early leaves RL something to do).
    """
    if steps < 0 or batch_size < 1 or check_every < 1:
        raise ValueError(
            f"need steps >= 0, batch_size >= 1, check_every >= 1; got {steps}, {batch_size}, {check_every}"
        )
    trainable = [t for t in trajectories if t.num_model_tokens]
    if steps and not trainable:
        raise ValueError(
            f"supervised_train got {len(trajectories)} trajectories and none has a loss-mask-1 token "
            "(a model-written token) to learn from"
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    bar = tqdm(range(1, steps + 1), desc="warm-up", disable=not progress, mininterval=2.0)
    for step in bar:
        picked = [trainable[rng.randrange(len(trainable))] for _ in range(batch_size)]
        loss = supervised_loss(model, picked, pad_token_id=pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if stop is not None and step % check_every == 0:
            model.eval()
            done = stop(step)
            model.train()
            if done:
                break
    bar.close()
    model.eval()
    return losses


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
