"""The warm-up's memory paths keep its loss: the LM head restricted to the trained positions, micro-batches and
activation checkpointing each give the loss and gradients of the plain full-logits computation (per row: the
model's whole logits, log-softmax, the trained tokens' log-probs summed, over the batch's trained-token count)."""

from __future__ import annotations

import copy
from typing import cast

import pytest
import torch
from torch import nn
from transformers import Gemma2Config, Gemma2ForCausalLM

from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.head import scoring_positions
from rlloom.core_rl.workers.supervised import (
    supervised_backward,
    supervised_nll_sum,
    supervised_train,
)

PAD = 0
# Agent-like rows: prompts of different lengths, model turns (mask 1) around observations (mask 0).
ROWS = [
    Trajectory(prompt_ids=[5, 6, 7], response_ids=[8, 9, 10, 11, 12, 13], loss_mask=[1, 1, 0, 0, 0, 1]),
    Trajectory(prompt_ids=[14], response_ids=[15, 16, 17], loss_mask=[0, 1, 1]),
    Trajectory(prompt_ids=[18, 19], response_ids=[20, 21, 22, 23, 24, 25, 26], loss_mask=[1, 0, 0, 0, 0, 1, 1]),
    Trajectory(prompt_ids=[27, 28, 29, 30], response_ids=[31, 32], loss_mask=[1, 1]),
]


def reference_loss(model: nn.Module, rows: list[Trajectory]) -> torch.Tensor:
    """The plain computation, row by row with no padding: full logits, log-softmax, trained tokens' NLL."""
    total = torch.zeros(())
    for row in rows:
        ids = torch.tensor([row.prompt_ids + row.response_ids])
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        start = len(row.prompt_ids)
        for j, (token, mask) in enumerate(zip(row.response_ids, row.loss_mask, strict=True)):
            if mask:
                total = total - logprobs[start + j - 1, token]
    return total / sum(sum(r.loss_mask) for r in rows)


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_loss_and_grads(model: nn.Module, run: object) -> None:
    """`run(model)` backpropagates and returns the loss; compare with `reference_loss` on a copy of `model`."""
    ref_model = copy.deepcopy(model)
    expected = reference_loss(ref_model, ROWS)
    expected.backward()  # type: ignore[no-untyped-call]
    got = run(model)  # type: ignore[operator]
    assert float(got.detach() if isinstance(got, torch.Tensor) else got) == pytest.approx(
        float(expected.detach()), rel=1e-5
    )
    ours, theirs = grads(model), grads(ref_model)
    assert ours.keys() == theirs.keys() and ours
    for name, grad in theirs.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_scoring_positions_are_the_columns_before_each_trained_token() -> None:
    batch = TrajectoryBatch.from_trajectories(ROWS[:2], PAD)  # prompt width 3, response width 6
    # row 0: prompt 5 6 7 | 8 9 10 11 12 13, trained 8 9 13 -> predicted from columns 2, 3 and 7
    # row 1: pad pad 14 | 15 16 17 pad pad pad, trained 16 17 -> predicted from columns 3 and 4
    expected = torch.zeros(2, 9, dtype=torch.bool)
    expected[0, [2, 3, 7]] = True
    expected[1, [3, 4]] = True
    assert torch.equal(scoring_positions(batch), expected)


@pytest.mark.parametrize("packed", [False, True])
def test_restricted_head_equals_full_logits(packed: bool) -> None:
    model = tiny_qwen2(char_tokenizer(), seed=1)
    seen: list[tuple[int, ...]] = []
    trained = sum(sum(r.loss_mask) for r in ROWS)

    def run(m: nn.Module) -> torch.Tensor:
        head = cast(nn.Module, m.lm_head)
        head.register_forward_hook(lambda _m, _a, out: seen.append(tuple(out.shape)))
        loss = supervised_nll_sum(m, TrajectoryBatch.from_trajectories(ROWS, PAD), packed=packed) / trained
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    assert_same_loss_and_grads(model, run)
    assert seen == [(1, trained, model.config.vocab_size)]  # the head ran on the 10 trained positions only


def test_full_logits_path_still_available() -> None:
    model = tiny_qwen2(char_tokenizer(), seed=2)
    batch = TrajectoryBatch.from_trajectories(ROWS, PAD)
    restricted = supervised_nll_sum(model, batch)
    plain = supervised_nll_sum(model, batch, restrict_head=False)
    assert float(restricted) == pytest.approx(float(plain), rel=1e-5)


def test_head_post_processing_is_kept() -> None:
    """Gemma 2 soft-caps its logits after the head: the restricted head must give the capped log-probs."""
    config = Gemma2Config(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, final_logit_softcapping=0.5, attn_logit_softcapping=None,
        max_position_embeddings=64, pad_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config)

    def run(m: nn.Module) -> torch.Tensor:
        trained = sum(sum(r.loss_mask) for r in ROWS)
        loss = supervised_nll_sum(m, TrajectoryBatch.from_trajectories(ROWS, PAD)) / trained
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    assert_same_loss_and_grads(model, run)


@pytest.mark.parametrize("budget", [None, 1, 12, 20])
def test_micro_batches_add_up_to_the_batch_mean(budget: int | None) -> None:
    model = tiny_qwen2(char_tokenizer(), seed=3)
    assert_same_loss_and_grads(
        model, lambda m: supervised_backward(m, ROWS, pad_token_id=PAD, max_tokens_per_micro_batch=budget)
    )


def test_checkpointed_training_takes_the_same_steps() -> None:
    """Same losses step by step with activation checkpointing and micro-batches as one plain forward per step; the
    model's checkpointing is off again afterwards."""
    plain, checkpointed = tiny_qwen2(char_tokenizer(), seed=4), tiny_qwen2(char_tokenizer(), seed=4)
    kwargs = {"pad_token_id": PAD, "steps": 3, "batch_size": 4, "lr": 1e-2, "progress": False}
    expected = supervised_train(plain, ROWS, max_tokens_per_micro_batch=None, **kwargs)  # type: ignore[arg-type]
    got = supervised_train(
        checkpointed,
        ROWS,
        max_tokens_per_micro_batch=8,
        gradient_checkpointing=True,
        **kwargs,  # type: ignore[arg-type]
    )
    assert got == pytest.approx(expected, rel=1e-5)
    assert not checkpointed.is_activation_checkpointing


def test_bad_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch must be >= 1"):
        supervised_train(tiny_qwen2(char_tokenizer()), ROWS, pad_token_id=PAD, steps=1, max_tokens_per_micro_batch=0)
