"""KL estimators (incl. straight-through), KL-in-reward, and the KL controllers."""

from __future__ import annotations

import math

import algorithms_numpy_reference as ref  # tests/ is on sys.path (conftest)
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlloom.core_rl.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    UnknownNameError,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)

FAST = settings(max_examples=25, deadline=None)
pairs = st.lists(st.tuples(st.floats(-8, 0, width=32), st.floats(-8, 0, width=32)), min_size=1, max_size=12)


@FAST
@given(pairs, st.sampled_from(["k1", "k2", "k3", "abs"]))
def test_estimators_match_numpy(data: list[tuple[float, float]], kind: str) -> None:
    logp = torch.tensor([[a for a, _ in data]], dtype=torch.float64)
    ref_lp = torch.tensor([[b for _, b in data]], dtype=torch.float64)
    got = kl_penalty(logp, ref_lp, kind, clamp=None)
    expected = [ref.kl(a, b, kind) for a, b in data]
    torch.testing.assert_close(got[0], torch.tensor(expected, dtype=torch.float64))


def test_hand_computed_values() -> None:
    logp, ref_lp = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    d = math.log(2.0)
    assert float(kl_penalty(logp, ref_lp, "k1")) == pytest.approx(d)
    assert float(kl_penalty(logp, ref_lp, "k2")) == pytest.approx(0.5 * d * d)
    assert float(kl_penalty(logp, ref_lp, "k3")) == pytest.approx(0.5 - 1 + d)  # e^{−d} + d − 1
    assert float(kl_penalty(-logp, -ref_lp, "abs")) == pytest.approx(d)


def test_verl_aliases() -> None:
    logp, ref_lp = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -0.5]])
    for alias, canonical in [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")]:
        torch.testing.assert_close(kl_penalty(logp, ref_lp, alias), kl_penalty(logp, ref_lp, canonical))


def test_k3_clamp() -> None:
    logp, ref_lp = torch.tensor([[-30.0]]), torch.tensor([[0.0]])
    assert float(kl_penalty(logp, ref_lp, "k3")) == 10.0
    assert float(kl_penalty(logp, ref_lp, "k3", clamp=None)) == pytest.approx(math.exp(30) - 31, rel=1e-5)


@FAST
@given(pairs, st.sampled_from(["k1", "k3", "abs"]))
def test_straight_through_has_the_value_of_k_and_the_gradient_of_k2(data: list[tuple[float, float]], kind: str) -> None:
    logp = torch.tensor([[a for a, _ in data]], dtype=torch.float64, requires_grad=True)
    ref_lp = torch.tensor([[b for _, b in data]], dtype=torch.float64)
    value = kl_penalty(logp, ref_lp, f"{kind}+")
    torch.testing.assert_close(value.detach(), kl_penalty(logp, ref_lp, kind).detach())
    (grad,) = torch.autograd.grad(value.sum(), logp)
    torch.testing.assert_close(grad, (logp - ref_lp).detach())  # d(½Δ²)/dlogp = Δ


def test_unknown_kind_names_the_nearest() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'low_var_kl'"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "low-var-kl")


def test_apply_kl_in_reward_hand_computed() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref_lp = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    new, current = apply_kl_in_reward(rewards, logp, ref_lp, mask, 0.1, "k1")
    torch.testing.assert_close(new, torch.tensor([[-0.05, -0.1, 1.0], [0.05, 2.0, 0.0]]))
    # row KLs: mean(0.5, 1, 0) = 0.5 and mean(−0.5, 0) = −0.25 → mean 0.125
    assert float(current) == pytest.approx(0.125)


def test_fixed_controller_and_state_roundtrip() -> None:
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 64)
    assert ctl.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_matches_reference_and_resumes() -> None:
    kls = [0.5, 12.0, 6.0, 6.5, 0.0]
    ctl = AdaptiveKLController(0.2, target_kl=6.0, horizon=10_000)
    for k in kls[:2]:
        ctl.update(k, 256)
    resumed = AdaptiveKLController(1.0, target_kl=1.0, horizon=1)
    resumed.load_state_dict(ctl.state_dict())
    for k in kls[2:]:
        resumed.update(k, 256)
    assert resumed.value == pytest.approx(ref.adaptive_kl(0.2, 6.0, 10_000, kls, 256))
    # KL above target raises β, below lowers it, by at most 20% · n/horizon.
    up = AdaptiveKLController(1.0, 1.0, 100)
    up.update(50.0, 10)
    assert up.value == pytest.approx(1.02)


def test_controller_errors() -> None:
    with pytest.raises(ValueError, match="target_kl and horizon"):
        make_kl_controller("adaptive", 0.1)
    with pytest.raises(ValueError, match="unknown KL controller"):
        make_kl_controller("adaptve", 0.1)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="missing key 'value'"):
        FixedKLController(0.1).load_state_dict({})
    assert isinstance(make_kl_controller("adaptive", 0.1, target_kl=6, horizon=10), AdaptiveKLController)
