"""Padding log-probs of −inf must not reach the gradient: every policy loss gives finite gradients, exactly zero at
the masked positions, and the same loss and gradient as with finite padding (issue 29: GSPO and CISPO gave nan)."""

from __future__ import annotations

import math

import pytest
import torch

from rlloom.core_rl.algorithms.policy_loss import get_policy_loss

_KWARGS: dict[str, dict[str, float]] = {
    "ppo": {"clip_low": 0.2, "clip_high": 0.28},
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4},
    "gmpo": {"clip_low": 0.4, "clip_high": 0.4},
    "cispo": {"clip_low": 0.2, "clip_high": 0.28},
    "gpg": {},
    "sapo": {},
    "clip_cov": {"clip_low": 0.2, "clip_high": 0.28},
    "kl_cov": {"clip_low": 0.2, "clip_high": 0.28},
}
_MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def _loss_and_grad(name: str, pad: float) -> tuple[float, torch.Tensor]:
    valid = _MASK.bool()
    logprobs = torch.where(valid, torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]), torch.tensor(pad))
    old = torch.where(valid, torch.tensor([[-1.1, -1.9, 0.0], [-0.4, 0.0, 0.0]]), torch.tensor(pad))
    logprobs.requires_grad_(True)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, _ = get_policy_loss(name)(logprobs, old, advantages, _MASK, **_KWARGS[name])
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.item(), grad


@pytest.mark.parametrize("name", sorted(_KWARGS))
def test_minus_inf_padding_gives_finite_gradients_zero_at_the_mask(name: str) -> None:
    loss, grad = _loss_and_grad(name, float("-inf"))
    assert math.isfinite(loss)
    assert torch.isfinite(grad).all(), f"{name}: nan/inf gradient {grad}"
    assert (grad[~_MASK.bool()] == 0).all()
    finite_loss, finite_grad = _loss_and_grad(name, -3.0)
    assert loss == pytest.approx(finite_loss, rel=1e-6)
    torch.testing.assert_close(grad, finite_grad)


def test_cispo_gradient_is_the_clipped_weight_times_advantage() -> None:
    """Hand value: ∂L/∂log π = −A·clip(ρ, 0.8, 1.28)/N with token-mean over N = 3 valid tokens."""
    _, grad = _loss_and_grad("cispo", float("-inf"))
    weights = [min(max(math.exp(d), 0.8), 1.28) for d in (0.1, -0.1, -0.1)]
    expected = torch.tensor([[-weights[0] / 3, -weights[1] / 3, 0.0], [weights[2] / 3, 0.0, 0.0]])
    torch.testing.assert_close(grad, expected)


def test_gspo_gradient_is_the_sequence_ratio_over_length() -> None:
    """Hand value (seq-mean-token-mean, 2 sequences): sequence 1 has s = exp((0.1 − 0.1)/2) = 1, inside the clip,
    so each token gets −A·s/(2·2) = −0.25; sequence 2 has s = exp(−0.1) < 1 − 3e-4 with A < 0: clipped, zero."""
    _, grad = _loss_and_grad("gspo", float("-inf"))
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]]))
