"""A short supervised warm-up: cross-entropy on (prompt, answer) pairs before RL.

GRPO learns only from groups whose rewards differ; a randomly initialised model answers nothing correctly, so
every advantage would be zero. A few seconds of teacher forcing on a slice of the task gives it some correct
answers to reinforce. The loss covers the answer and the EOS token only, and the prompt is rendered with the
same chat template the rollout engine uses, so the warmed-up model sees exactly the token ids RL will send it.
The training loop is core-rl's (`rlloom.core_rl.workers.supervised_train`); this module only renders the
pairs. `warm_up_rows` is `reasoning warmup`'s run: real rows' worked solutions (warmup_rows.py) as the pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from rlloom_apps.reasoning.warmup_settings import WarmupSettings
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlloom.core_rl.contracts import GenerationRequest, Trajectory, render_prompt
from rlloom.core_rl.workers import DEFAULT_MICRO_BATCH_TOKENS, supervised_train


def warmup_trajectories(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[tuple[list[dict[str, str]], str]]
) -> list[Trajectory]:
    """One trajectory per (chat messages, answer): the templated prompt, then answer + EOS, all trained."""
    if tokenizer.eos_token_id is None:
        raise ValueError("warm-up: the tokenizer has no eos_token_id; the answer must end with EOS as RL samples it")
    out = []
    for messages, answer in examples:
        prompt = render_prompt(tokenizer, GenerationRequest(messages=messages))  # as the engine renders it
        completion = [*tokenizer(answer, add_special_tokens=False)["input_ids"], int(tokenizer.eos_token_id)]
        out.append(Trajectory(prompt_ids=prompt, response_ids=completion, loss_mask=[1] * len(completion)))
    return out


def supervised_warmup(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[list[dict[str, str]], str]],
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    stop: Callable[[], bool] | None = None,
    check_every: int = 20,
    progress: bool = True,
    max_tokens_per_micro_batch: int | None = DEFAULT_MICRO_BATCH_TOKENS,
    gradient_checkpointing: bool = False,
) -> list[float]:
    """Train `model` in place for up to `steps` AdamW steps on random batches of `examples`; returns the losses.

    `stop`, called every `check_every` steps (with the model in eval mode), ends the warm-up early when it returns
    True: the demo stops once the model gets some answers right, leaving the rest for RL to learn.
    """
    if steps and not examples:
        raise ValueError("warm-up got no examples; give it a non-empty slice of the training rows")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return supervised_train(
        model,
        warmup_trajectories(tokenizer, examples),
        pad_token_id=int(pad),
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        stop=(lambda _step: stop()) if stop is not None else None,
        check_every=check_every,
        progress=progress,
        max_tokens_per_micro_batch=max_tokens_per_micro_batch,
        gradient_checkpointing=gradient_checkpointing,
    )


Example = tuple[list[dict[str, str]], str]


@dataclass(frozen=True, slots=True)
class WarmupResult:
    """What `reasoning warmup` did: its steps and losses, and the held-out demonstrations' loss around it."""

    demonstrations: int
    steps: int
    losses: list[float]
    heldout_before: float | None
    heldout_after: float | None


def warm_up_rows(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Example],
    settings: WarmupSettings,
    *,
    val: Sequence[Example] | None = None,
) -> WarmupResult:
    """`settings.epochs` passes of `supervised_warmup` over `train`; with `val`, its loss before and after."""
    before = heldout_loss(model, tokenizer, val) if val else None
    steps = settings.steps(len(train))
    losses = supervised_warmup(
        model,
        tokenizer,
        train,
        steps=steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        seed=settings.seed,
        max_tokens_per_micro_batch=settings.max_tokens_per_micro_batch,
        gradient_checkpointing=settings.gradient_checkpointing,
    )
    after = heldout_loss(model, tokenizer, val) if val else None
    return WarmupResult(len(train), steps, losses, before, after)


@torch.no_grad()
def heldout_loss(model: nn.Module, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example]) -> float:
    """Mean negative log-likelihood per answer token (answer + EOS, as trained) over all `examples`, one at a time
    through the plain causal-LM forward, so it checks the trained loss rather than repeating its code."""
    model.eval()
    device = next(model.parameters()).device
    total, tokens = 0.0, 0
    for trajectory in warmup_trajectories(tokenizer, examples):
        ids = torch.tensor([[*trajectory.prompt_ids, *trajectory.response_ids]], device=device)
        logits = model(input_ids=ids).logits[0, len(trajectory.prompt_ids) - 1 : -1].float()
        targets = ids[0, len(trajectory.prompt_ids) :]
        total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        tokens += len(targets)
    return total / tokens
