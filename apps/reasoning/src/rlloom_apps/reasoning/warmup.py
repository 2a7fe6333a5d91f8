"""A short supervised warm-up: cross-entropy on (prompt, answer) pairs before RL.

GRPO learns only from groups whose rewards differ; a randomly initialised model answers nothing correctly, so
every advantage would be zero. A few seconds of teacher forcing on a slice of the task gives it some correct
answers to reinforce. The loss covers the answer and the EOS token only, and the prompt is rendered with the
same chat template the rollout engine uses, so the warmed-up model sees exactly the token ids RL will send it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _example_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], answer: str
) -> tuple[list[int], int]:
    """Token ids of prompt + answer + EOS, and the prompt length (where the loss starts)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = list(tokenizer(str(text), add_special_tokens=False)["input_ids"])
    completion = [*tokenizer(answer, add_special_tokens=False)["input_ids"], int(tokenizer.eos_token_id)]
    return prompt + completion, len(prompt)


def supervised_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[list[dict[str, str]], str]],
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    stop: Callable[[], bool] | None = None,
    check_every: int = 20,
) -> list[float]:
    """Train `model` in place for up to `steps` AdamW steps on random batches of `examples`; returns the losses.

    `stop`, called every `check_every` steps (with the model in eval mode), ends the warm-up early when it returns
    True: the demo stops once the model gets some answers right, leaving the rest for RL to learn.
    """
    if steps < 0 or batch_size < 1:
        raise ValueError(f"warm-up needs steps >= 0 and batch_size >= 1, got steps={steps}, batch_size={batch_size}")
    if check_every < 1:
        raise ValueError(f"warm-up needs check_every >= 1, got {check_every}")
    if steps and not examples:
        raise ValueError("warm-up got no examples; give it a non-empty slice of the training rows")
    encoded = [_example_ids(tokenizer, messages, answer) for messages, answer in examples]
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    for step in range(1, steps + 1):
        picked = [encoded[rng.randrange(len(encoded))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in picked)
        input_ids = torch.full((batch_size, width), pad)
        labels = torch.full((batch_size, width), -100)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (ids, start) in enumerate(picked):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, start : len(ids)] = torch.tensor(ids[start:])
            attention[row, : len(ids)] = 1
        loss: Any = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if stop is not None and step % check_every == 0:
            model.eval()
            if stop():
                break
            model.train()
    model.eval()
    return losses
