"""Supervised warm-up on trajectories: the loss is exactly the cross-entropy of the loss-mask-1 tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from rlloom.agent import supervised_warmup, warmup_examples
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.trajectory import Trajectory


def trajectory() -> Trajectory:
    # prompt [5, 6], the model writes [7, 8], an observation [9, 10] (mask 0), the model writes [11]
    return Trajectory(prompt_ids=[5, 6], response_ids=[7, 8, 9, 10, 11], loss_mask=[1, 1, 0, 0, 1])


def test_examples_label_only_the_models_tokens() -> None:
    assert warmup_examples([trajectory()]) == [([5, 6, 7, 8, 9, 10, 11], [-100, -100, 7, 8, -100, -100, 11])]


def test_first_loss_is_the_cross_entropy_of_the_masked_tokens_and_it_falls() -> None:
    tok = char_tokenizer()
    model = tiny_qwen2(tok, seed=0)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10, 11]])).logits[0]
    # next-token predictions at positions 1, 2 and 5 are for tokens 7, 8 and 11
    expected = torch.nn.functional.cross_entropy(logits[[1, 2, 5]], torch.tensor([7, 8, 11]))
    losses = supervised_warmup(
        model, [trajectory()], pad_token_id=tok.pad_token_id, steps=30, batch_size=2, lr=1e-2, progress=False
    )
    assert losses[0] == pytest.approx(float(expected), rel=1e-5)
    assert losses[-1] < losses[0] / 4
    assert not model.training


def test_trajectories_without_model_tokens_are_refused() -> None:
    tok = char_tokenizer()
    empty = Trajectory(prompt_ids=[5], response_ids=[9], loss_mask=[0])
    with pytest.raises(ValueError, match="no trajectory with a model token"):
        supervised_warmup(tiny_qwen2(tok), [empty], pad_token_id=0, steps=1, progress=False)
