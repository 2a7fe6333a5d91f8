"""Policy and value losses: numpy reference, hand-computed boundaries, gradients, registry."""

from __future__ import annotations

import math

import algorithms_numpy_reference as ref  # tests/ is on sys.path (conftest)
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlloom.core_rl.algorithms import (
    AGG_MODES,
    UnknownNameError,
    cispo_policy_loss,
    clip_cov_policy_loss,
    get_policy_loss,
    gmpo_policy_loss,
    gpg_policy_loss,
    gspo_policy_loss,
    kl_cov_policy_loss,
    ppo_policy_loss,
    sapo_policy_loss,
    value_loss,
)

FAST = settings(max_examples=25, deadline=None)


def _one_token_grad(log_ratio: float, adv: float, **kw: float | None) -> tuple[float, float]:
    """(loss, d loss / d logp) of PPO on a single token with old logp 0."""
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, _ = ppo_policy_loss(
        logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[adv]], dtype=torch.float64), torch.ones(1, 1), **kw
    )  # type: ignore[arg-type]
    loss.backward()
    assert logp.grad is not None
    return float(loss.detach()), float(logp.grad)


# ---- PPO: clip-higher and dual-clip boundaries ------------------------------------------------------------------


def test_clip_higher_bounds_positive_advantages_at_1_plus_eps_high() -> None:
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    # ρ just inside 1 + 0.28: unclipped, gradient −A·ρ; just outside: loss −A·1.28 and no gradient.
    loss, grad = _one_token_grad(math.log(1.27), 2.0, **kw)
    assert loss == pytest.approx(-2.0 * 1.27) and grad == pytest.approx(-2.0 * 1.27)
    loss, grad = _one_token_grad(math.log(1.29), 2.0, **kw)
    assert loss == pytest.approx(-2.0 * 1.28) and grad == 0.0
    # A symmetric 0.2 clip would already have clipped ρ = 1.27.
    _, grad = _one_token_grad(math.log(1.27), 2.0, clip_low=0.2, clip_high=0.2)
    assert grad == 0.0


def test_lower_clip_bounds_negative_advantages_at_1_minus_eps_low() -> None:
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    loss, grad = _one_token_grad(math.log(0.81), -1.0, **kw)
    assert loss == pytest.approx(0.81) and grad == pytest.approx(0.81)
    loss, grad = _one_token_grad(math.log(0.79), -1.0, **kw)
    assert loss == pytest.approx(0.8) and grad == 0.0
    # A positive advantage with a small ratio is never clipped (the pessimistic bound is the unclipped term).
    _, grad = _one_token_grad(math.log(0.5), 1.0, **kw)
    assert grad == pytest.approx(-0.5)


def test_dual_clip_caps_negative_advantages_at_c() -> None:
    kw = {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}
    loss, grad = _one_token_grad(math.log(2.9), -1.0, **kw)
    assert loss == pytest.approx(2.9) and grad == pytest.approx(2.9)
    loss, grad = _one_token_grad(math.log(3.1), -1.0, **kw)
    assert loss == pytest.approx(3.0) and grad == 0.0
    # Without the dual clip the loss keeps growing with ρ.
    loss, _ = _one_token_grad(math.log(10.0), -1.0, clip_low=0.2, clip_high=0.2)
    assert loss == pytest.approx(10.0)
    # Positive advantages are untouched by the dual clip.
    loss, grad = _one_token_grad(math.log(5.0), 1.0, **kw)
    assert loss == pytest.approx(-1.2) and grad == 0.0


@FAST
@given(
    st.floats(-3, 3, allow_nan=False),
    st.floats(-2, 2, allow_nan=False).filter(lambda a: abs(a) > 1e-3),
    st.sampled_from([None, 2.0, 3.0]),
)
def test_ppo_gradient_is_zero_exactly_where_a_clip_binds(log_ratio: float, adv: float, dual: float | None) -> None:
    clip_low, clip_high = 0.2, 0.28
    ratio = math.exp(log_ratio)
    near_edge = min(abs(ratio - 1 - clip_high), abs(ratio - 1 + clip_low), abs(ratio - (dual or 0.0)))
    if near_edge < 1e-9:
        return  # exactly on a boundary the subgradient is either value
    _, grad = _one_token_grad(log_ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual)
    clipped = (adv > 0 and ratio > 1 + clip_high) or (adv < 0 and ratio < 1 - clip_low)
    dual_bound = dual is not None and adv < 0 and ratio > dual
    if clipped or dual_bound:
        assert grad == 0.0
    else:
        assert grad == pytest.approx(-adv * ratio, rel=1e-9)  # d(−A·ρ)/d log π = −A·ρ


def test_ppo_metrics_hand_computed() -> None:
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5, 4.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    _, m = ppo_policy_loss(logp, torch.zeros(1, 4), adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # ε-clip active where the clipped term is the larger: tokens 0 (ρ 1.5, A > 0) and 2 (ρ 0.5, A < 0); token 3
    # (ρ 4, A < 0) is bounded by the dual clip instead.
    assert float(m["pg_clipfrac"]) == pytest.approx(2 / 4)
    assert float(m["pg_clipfrac_lower"]) == pytest.approx(1 / 4)  # token 3 hits the dual clip
    assert float(m["ppo_kl"]) == pytest.approx(-float(logp.mean()))
    assert all(not v.requires_grad for v in m.values())


def test_ppo_argument_errors() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_policy_loss(x, x, x, x, clip_low=0.2, clip_high=0.2, dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low must lie in"):
        ppo_policy_loss(x, x, x, x, clip_low=1.0, clip_high=0.2)
    with pytest.raises(ValueError, match=r"advantages\(1, 3\)"):
        ppo_policy_loss(x, x, torch.zeros(1, 3), x, clip_low=0.2, clip_high=0.2)
    with pytest.raises(UnknownNameError, match="loss aggregation mode 'token_mean'. Did you mean 'token-mean'"):
        ppo_policy_loss(x, x, x, x, clip_low=0.2, clip_high=0.2, agg="token_mean")


# ---- PPO against numpy ------------------------------------------------------------------------------------------

loss_batches = st.tuples(st.integers(1, 4), st.integers(1, 6)).flatmap(
    lambda bt: st.tuples(
        *(st.lists(st.floats(-1.5, 1.5, width=32), min_size=bt[0] * bt[1], max_size=bt[0] * bt[1]) for _ in range(4)),
        st.lists(st.integers(0, 1), min_size=bt[0] * bt[1], max_size=bt[0] * bt[1]),
        st.just(bt),
    )
)


def _unpack(data):  # type: ignore[no-untyped-def]
    a, b, c, d, m, (bs, t) = data

    def f(x: list[float]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.float64).reshape(bs, t)

    return f(a), f(b), f(c), f(d), torch.tensor(m).reshape(bs, t)


@FAST
@given(loss_batches, st.sampled_from(AGG_MODES), st.sampled_from([None, 2.0, 3.0]), st.booleans())
def test_ppo_matches_numpy(data, mode: str, dual: float | None, weighted: bool) -> None:  # type: ignore[no-untyped-def]
    logp, old, adv, w, mask = _unpack(data)
    weights = w.abs() if weighted else None
    loss, _ = ppo_policy_loss(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.3, dual_clip=dual, agg=mode, rollout_is_weights=weights
    )
    expected = ref.ppo_loss(
        logp.numpy(),
        old.numpy(),
        adv.numpy(),
        mask.numpy(),
        clip_low=0.2,
        clip_high=0.3,
        dual_clip=dual,
        mode=mode,
        weights=None if weights is None else weights.numpy(),
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@FAST
@given(loss_batches, st.sampled_from(["ppo", "gspo", "cispo", "gpg", "sapo"]), st.sampled_from(AGG_MODES))
def test_masked_tokens_get_exactly_zero_gradient(data, name: str, mode: str) -> None:  # type: ignore[no-untyped-def]
    logp, old, adv, _, mask = _unpack(data)
    logp = logp.clone().requires_grad_(True)
    loss, _ = get_policy_loss(name)(logp, old, adv, mask, clip_low=0.2, clip_high=0.3, agg=mode)
    loss.backward()
    assert logp.grad is not None
    assert torch.all(logp.grad[~mask.bool()] == 0)


# ---- GSPO -------------------------------------------------------------------------------------------------------


@FAST
@given(loss_batches)
def test_gspo_matches_numpy_sequence_objective(data) -> None:  # type: ignore[no-untyped-def]
    logp, old, adv, _, mask = _unpack(data)
    if not mask.any():
        return
    adv = adv[:, :1].expand_as(adv)  # GSPO's advantage is per sequence
    loss, _ = gspo_policy_loss(logp * 0.01, old * 0.01, adv, mask, clip_low=3e-4, clip_high=4e-4)
    expected = ref.gspo_loss(
        (logp * 0.01).numpy(), (old * 0.01).numpy(), adv.numpy(), mask.numpy(), clip_low=3e-4, clip_high=4e-4
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_gspo_token_gradient_equals_the_sequence_level_gradient() -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])
    old = torch.randn(2, 4, dtype=torch.float64) * 0.1
    base = old + torch.randn(2, 4, dtype=torch.float64) * 1e-4  # ratios inside the tiny clip range for one row
    base[1] = old[1] + 0.05  # and far outside it for the other
    adv = torch.tensor([[-1.5], [0.7]], dtype=torch.float64).expand(2, 4)
    logp = base.clone().requires_grad_(True)
    loss, _ = gspo_policy_loss(logp, old, adv, mask)
    loss.backward()
    # Sequence-level GSPO written directly: s_i = exp(mean_t(logp − old)) WITH gradient, per-sequence clip.
    direct = base.clone().requires_grad_(True)
    m = mask.to(torch.float64)
    s = torch.exp(((direct - old) * m).sum(-1) / m.sum(-1))
    a = adv[:, 0]
    seq_loss = torch.maximum(-a * s, -a * s.clamp(1 - 3e-4, 1 + 4e-4)).mean()
    seq_loss.backward()
    torch.testing.assert_close(loss, seq_loss)
    assert logp.grad is not None and direct.grad is not None
    torch.testing.assert_close(logp.grad, direct.grad)
    assert torch.all(logp.grad[1] == 0)  # A > 0 and s above 1 + ε_high: clipped, no gradient
    assert torch.all(logp.grad[0, :3] != 0)


def test_gspo_refuses_dual_clip() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="GSPO has no dual clip"):
        gspo_policy_loss(x, x, x, x, dual_clip=3.0)


# ---- GMPO -------------------------------------------------------------------------------------------------------


def test_gmpo_hand_computed() -> None:
    # one sequence, A = 1 on both tokens, log-ratios 0.1 and 0.6: the 0.6 is clipped to 0.4 (A > 0) →
    # ρ̄ = exp((0.1 + 0.4)/2), loss = −ρ̄. With A = −1 the pessimistic side is the larger log-ratio → exp(0.35).
    logp = torch.tensor([[0.1, 0.6]], dtype=torch.float64, requires_grad=True)
    old, mask = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2)
    loss, m = gmpo_policy_loss(logp, old, torch.ones(1, 2, dtype=torch.float64), mask)
    assert float(loss.detach()) == pytest.approx(-math.exp(0.25))
    assert float(m["pg_clipfrac"]) == pytest.approx(0.5)
    loss.backward()
    assert logp.grad is not None
    np.testing.assert_allclose(logp.grad.numpy(), [[-math.exp(0.25) / 2, 0.0]])  # the clipped token: no gradient
    neg, _ = gmpo_policy_loss(logp.detach(), old, -torch.ones(1, 2, dtype=torch.float64), mask)
    assert float(neg) == pytest.approx(math.exp(0.35))


@FAST
@given(loss_batches)
def test_gmpo_matches_numpy_and_masks_gradients(data) -> None:  # type: ignore[no-untyped-def]
    logp, old, adv, _, mask = _unpack(data)
    if not mask.any():
        return
    logp = logp.clone().requires_grad_(True)
    loss, _ = gmpo_policy_loss(logp, old, adv, mask, clip_low=0.4, clip_high=0.4)
    expected = ref.gmpo_loss(logp.detach().numpy(), old.numpy(), adv.numpy(), mask.numpy(), clip_low=0.4, clip_high=0.4)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    loss.backward()
    assert logp.grad is not None
    assert torch.all(logp.grad[~mask.bool()] == 0)


def test_gmpo_refuses_what_it_cannot_honour() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="set loss_agg_mode='seq-mean-token-mean'"):
        gmpo_policy_loss(x, x, x, x, agg="token-mean")
    with pytest.raises(ValueError, match="use policy_loss=ppo with TIS"):
        gmpo_policy_loss(x, x, x, x, rollout_is_weights=x)
    assert get_policy_loss("geo_mean") is gmpo_policy_loss is get_policy_loss("gmpo")


# ---- CISPO ------------------------------------------------------------------------------------------------------


def test_cispo_keeps_a_bounded_gradient_on_clipped_tokens() -> None:
    logp = torch.log(torch.tensor([[2.0, 1.1]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, m = cispo_policy_loss(logp, old, adv, torch.ones(1, 2), clip_low=1.0 - 1e-9, clip_high=0.28)
    loss.backward()
    # L = −(1/2)(1.28·log 2 + 1.1·log 1.1); dL/dlogp = −(1/2)·[1.28, 1.1]
    assert float(loss.detach()) == pytest.approx(-0.5 * (1.28 * math.log(2.0) + 1.1 * math.log(1.1)))
    assert logp.grad is not None
    np.testing.assert_allclose(logp.grad.numpy(), [[-0.64, -0.55]])
    assert float(m["pg_clipfrac"]) == pytest.approx(0.5)


# ---- value loss -------------------------------------------------------------------------------------------------


def test_value_loss_hand_computed() -> None:
    values = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0]])
    loss, m = value_loss(values, old, returns, torch.ones(1, 2), clip=0.5)
    # token 0: unclipped (1−2)² = 1, clipped (0.5−2)² = 2.25 → 2.25; token 1: 1 both → ½·mean(2.25, 1)
    assert float(loss.detach()) == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert float(m["vf_clipfrac"]) == pytest.approx(0.5)
    loss.backward()
    assert values.grad is not None
    np.testing.assert_allclose(values.grad.numpy(), [[0.0, -0.5]])  # clipped token: no gradient


@FAST
@given(loss_batches, st.sampled_from([None, 0.2, 1.0]), st.sampled_from(AGG_MODES))
def test_value_loss_matches_numpy(data, clip: float | None, mode: str) -> None:  # type: ignore[no-untyped-def]
    values, old, returns, _, mask = _unpack(data)
    loss, _ = value_loss(values, old, returns, mask, clip=clip, agg=mode)
    expected = ref.value_loss(values.numpy(), old.numpy(), returns.numpy(), mask.numpy(), clip=clip, mode=mode)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_registry_names_and_errors() -> None:
    assert get_policy_loss("ppo") is ppo_policy_loss
    assert get_policy_loss("gspo") is gspo_policy_loss
    assert get_policy_loss("gpg") is gpg_policy_loss
    assert get_policy_loss("sapo") is sapo_policy_loss
    with pytest.raises(UnknownNameError, match="Did you mean 'gspo'"):
        get_policy_loss("gpso")


# ---- Clip-Cov / KL-Cov (Cui et al. 2025), hand-computed ---------------------------------------------------------
# three valid tokens: A = [1, -1, 2], log π = [-1, -2, -0.5], log π_old = [-1.1, -2.3, -0.7] (Δ = [0.1, 0.3, 0.2]).
# Centred: A − 2/3 = [1/3, −5/3, 4/3], log π + 7/6 = [1/6, −5/6, 2/3], so cov = [1/18, 25/18, 16/18].
COV_ADV = torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64)
COV_OLD = torch.tensor([[-1.1, -2.3, -0.7]], dtype=torch.float64)
COV_MASK = torch.ones(1, 3)


def _cov_logprobs() -> torch.Tensor:
    return torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)


def test_kl_cov_penalises_the_highest_covariance_token() -> None:
    logp = _cov_logprobs()
    loss, metrics = kl_cov_policy_loss(
        logp, COV_OLD, COV_ADV, COV_MASK, clip_low=0.2, clip_high=0.2, kl_cov_ratio=0.0002, ppo_kl_coef=1.0
    )
    # one token (max(1, ⌊3 × 0.0002⌋)): token 1, cov 25/18; the surrogate is unclipped
    expected = (-1.0 * math.exp(0.1) + 1.0 * math.exp(0.3) - 2.0 * math.exp(0.2) + 0.3) / 3
    assert float(loss) == pytest.approx(expected)
    loss.backward()
    assert logp.grad is not None
    grads = logp.grad[0].tolist()
    assert grads == pytest.approx([-math.exp(0.1) / 3, (math.exp(0.3) + 1.0) / 3, -2.0 * math.exp(0.2) / 3])
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 3)


def test_clip_cov_cuts_the_gradient_of_tokens_in_the_covariance_band() -> None:
    # band (0.5, 5): tokens 1 and 2 qualify (neither is PPO-clipped at ε = 0.28); ratio 1.0 cuts both
    logp = _cov_logprobs()
    loss, metrics = clip_cov_policy_loss(
        logp, COV_OLD, COV_ADV, COV_MASK, clip_low=0.2, clip_high=0.28, clip_cov_ratio=1.0, clip_cov_lb=0.5
    )
    assert float(loss) == pytest.approx(-math.exp(0.1) / 3)  # only token 0's PPO term is left
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.1) / 3, 0.0, 0.0])
    assert float(metrics["pg_clipfrac"]) == pytest.approx(2 / 3)
    # the paper's tiny ratio cuts max(1, ⌊3 × 0.0002⌋) = 1 of the two, drawn at random
    torch.manual_seed(0)
    small, _ = clip_cov_policy_loss(
        _cov_logprobs(), COV_OLD, COV_ADV, COV_MASK, clip_low=0.2, clip_high=0.28, clip_cov_lb=0.5
    )
    full = [-math.exp(0.1), math.exp(0.3), -2.0 * math.exp(0.2)]
    assert float(small) * 3 in (pytest.approx(sum(full) - full[1]), pytest.approx(sum(full) - full[2]))


def test_policy_loss_kwargs_are_checked_against_the_losss_signature() -> None:
    from rlloom.core_rl.config.loading import load_config
    from rlloom.core_rl.config.schema import ConfigError

    base = ["model.path=/m", "algorithm.policy_loss.name=kl_cov"]
    with pytest.raises(ConfigError, match=r"algorithm.policy_loss.kwargs: clip_cov_ratio is not a setting of .*kl_cov"):
        load_config(None, [*base, "algorithm.policy_loss.kwargs={clip_cov_ratio: 0.1}"])
    with pytest.raises(ConfigError, match="algorithm.policy_loss.dual_clip: "):
        load_config(None, [*base, "algorithm.policy_loss.dual_clip=3"])
    cfg = load_config(None, [*base, "algorithm.policy_loss.kwargs={kl_cov_ratio: 0.5, ppo_kl_coef: 2.0}"])
    assert cfg.algorithm.policy_loss.kwargs == {"kl_cov_ratio": 0.5, "ppo_kl_coef": 2.0}


# ---- GPG (Chu et al. 2025, arXiv 2504.02546; veRL loss_mode=gpg) -----------------------------------------------


def test_gpg_hand_computed_loss_gradient_and_metrics() -> None:
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.7, -9.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.2, -0.5, -1.0], [-0.3, -0.2, 5.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, metrics = gpg_policy_loss(logp, old, adv, mask)
    # token-mean of −A·log π over the 5 valid tokens: −(2·(−3.5) + (−1)·(−1.0)) / 5 = 6/5
    assert float(loss.detach()) == pytest.approx(1.2)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.flatten().tolist() == pytest.approx([-0.4, -0.4, -0.4, 0.2, 0.2, 0.0])  # −A/5, 0 where masked
    # ppo_kl: mean of log π_old − log π over the valid tokens = (−0.2 + 0 + 1.0 + 0 + 0.5) / 5
    assert float(metrics["ppo_kl"]) == pytest.approx(0.26)
    assert float(metrics["pg_clipfrac"]) == 0.0 and float(metrics["pg_clipfrac_lower"]) == 0.0
    # no ratio: the old policy changes nothing but the drift metric
    again, _ = gpg_policy_loss(logp, torch.zeros_like(old), adv, mask)
    assert float(again.detach()) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="GPG has no ratio to dual-clip"):
        gpg_policy_loss(logp, old, adv, mask, dual_clip=3.0)


def test_gpg_gradient_is_minus_advantage_times_the_score_function() -> None:
    """On a softmax policy π(y|x) = softmax(W·x)[y], GPG's gradient is −(1/N)·Σₜ Aₜ·∇log π(yₜ|xₜ) with the textbook
    score function ∇_W log π(y|x) = (e_y − π(·|x))·xᵀ; with a current policy it equals PPO's gradient at ratio 1."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)  # [B, T, features]
    y = torch.randint(0, 5, (2, 3), generator=gen)
    weight = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.5, 1.5, 1.5], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])

    def logprobs() -> torch.Tensor:
        return torch.log_softmax(x @ weight.T, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)

    stale = torch.full((2, 3), -3.0, dtype=torch.float64)  # any old policy: GPG has no ratio
    loss, _ = gpg_policy_loss(logprobs(), stale, adv, mask)
    (grad,) = torch.autograd.grad(loss, weight)
    probs = torch.softmax(x @ weight.detach().T, -1)
    expected = torch.zeros(5, 4, dtype=torch.float64)
    for b, t in mask.nonzero().tolist():
        score = torch.outer(torch.nn.functional.one_hot(y[b, t], 5).double() - probs[b, t], x[b, t])
        expected -= adv[b, t] * score / int(mask.sum())
    assert torch.allclose(grad, expected)
    current = logprobs()
    ppo, _ = ppo_policy_loss(current, current.detach(), adv, mask, clip_low=0.2, clip_high=0.2)
    (ppo_grad,) = torch.autograd.grad(ppo, weight)
    assert torch.allclose(grad, ppo_grad)


@FAST
@given(loss_batches, st.sampled_from(AGG_MODES), st.booleans())
def test_gpg_matches_numpy(data, mode: str, weighted: bool) -> None:  # type: ignore[no-untyped-def]
    logp, old, adv, w, mask = _unpack(data)
    weights = w.abs() if weighted else None
    loss, _ = gpg_policy_loss(logp, old, adv, mask, agg=mode, rollout_is_weights=weights)
    expected = ref.gpg_loss(
        logp.numpy(), adv.numpy(), mask.numpy(), mode=mode, weights=None if weights is None else weights.numpy()
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-9)


# ---- SAPO (Gao et al. 2025, arXiv 2511.20347; veRL loss_mode=sapo) ---------------------------------------------


def _sapo_one_token(ratio: float, adv: float, **taus: float) -> tuple[float, float]:
    """(loss, d loss / d log π) of SAPO on a single token with old log-prob 0."""
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss, _ = sapo_policy_loss(
        logp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor([[adv]], dtype=torch.float64),
        torch.ones(1, 1),
        **taus,
    )  # type: ignore[arg-type]
    loss.backward()
    assert logp.grad is not None
    return float(loss.detach()), float(logp.grad)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _sapo_weight(ratio: float, tau: float) -> float:
    """d/d log π of the gate (4/τ)·σ(τ(r − 1)), r = exp(log π − log π_old): 4·σ·(1 − σ)·r, worked out by hand."""
    s = _sigmoid(tau * (ratio - 1.0))
    return 4.0 * s * (1.0 - s) * ratio


def test_sapo_hand_computed_token() -> None:
    # r = 2, A = 1, τ_pos = 1: loss −4·σ(1), gradient −4·σ(1)·(1 − σ(1))·2
    loss, grad = _sapo_one_token(2.0, 1.0, tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(-2.9242343145)
    assert grad == pytest.approx(-1.5728954659)


@pytest.mark.parametrize("tau", [0.5, 1.0, 1.05, 3.0])
@pytest.mark.parametrize("adv", [2.0, -0.7])
def test_sapo_at_ratio_one_is_the_plain_policy_gradient(tau: float, adv: float) -> None:
    """σ(0) = ½: the gate is 2/τ and its slope 1, so on-policy SAPO has exactly the gradient −A·∇log π."""
    loss, grad = _sapo_one_token(1.0, adv, tau_pos=tau, tau_neg=tau)
    assert loss == pytest.approx(-adv * 2.0 / tau)
    assert grad == pytest.approx(-adv)


def test_sapo_on_policy_gradient_equals_gpg_on_a_batch() -> None:
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.7, -0.9]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    sapo, _ = sapo_policy_loss(logp, logp.detach(), adv, mask, agg="seq-mean-token-mean")
    gpg, _ = gpg_policy_loss(logp, logp.detach(), adv, mask, agg="seq-mean-token-mean")
    (g_sapo,) = torch.autograd.grad(sapo, logp)
    (g_gpg,) = torch.autograd.grad(gpg, logp)
    assert torch.allclose(g_sapo, g_gpg)
    # seq-mean-token-mean: −A/|yᵢ|/2 per valid token
    assert g_sapo.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, -1 / 3, 0.25, 0.25, 0.0])


def test_sapo_down_weights_far_off_policy_tokens_smoothly() -> None:
    """The gradient weight w(r) = 4σ(1 − σ)·r: 1 on-policy, falling smoothly to ~0 far from 1 on both sides, never
    the hard zero of PPO's clip (which is exactly 0 just past 1 + ε for A > 0)."""
    ratios = [0.05, 0.1, 0.5, 1.0, 3.0, 5.0, 10.0]
    weights = [-_sapo_one_token(r, 1.0, tau_pos=1.0)[1] for r in ratios]
    assert weights == pytest.approx([_sapo_weight(r, 1.0) for r in ratios])
    assert weights[3] == pytest.approx(1.0)
    assert weights[:4] == sorted(weights[:4])  # rising toward r = 1 from below
    assert weights[4:] == sorted(weights[4:], reverse=True)  # falling far above 1
    assert weights[0] < 0.05 and weights[-1] < 0.01
    # just past PPO's clip-higher bound: PPO's gradient is 0, SAPO's barely differs from just inside it
    _, ppo_grad = _one_token_grad(math.log(1.29), 2.0, clip_low=0.2, clip_high=0.28)
    _, inside = _sapo_one_token(1.27, 2.0, tau_pos=1.0)
    _, outside = _sapo_one_token(1.29, 2.0, tau_pos=1.0)
    assert ppo_grad == 0.0 and outside < 0 and abs(outside - inside) < 0.05
    # a hotter gate (larger τ) cuts off sooner
    assert -_sapo_one_token(3.0, 1.0, tau_pos=3.0)[1] < 0.05 < weights[4]


@pytest.mark.parametrize("ratio", [0.6, 1.5])
def test_sapo_each_advantage_sign_uses_its_own_temperature(ratio: float) -> None:
    taus = {"tau_pos": 1.0, "tau_neg": 3.0}
    assert _sapo_weight(ratio, 1.0) != pytest.approx(_sapo_weight(ratio, 3.0))  # the check can tell them apart
    loss, grad = _sapo_one_token(ratio, 1.0, **taus)
    assert loss == pytest.approx(-4.0 * _sigmoid(ratio - 1.0))
    assert grad == pytest.approx(-_sapo_weight(ratio, 1.0))
    loss, grad = _sapo_one_token(ratio, -1.0, **taus)
    assert loss == pytest.approx(4.0 / 3.0 * _sigmoid(3.0 * (ratio - 1.0)))
    assert grad == pytest.approx(_sapo_weight(ratio, 3.0))
    # both signs in one batch, token-mean over 3 tokens (A = 0 contributes nothing)
    logp = torch.full((1, 3), math.log(ratio), dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 0.0]], dtype=torch.float64)
    loss_t, _ = sapo_policy_loss(
        logp, torch.zeros(1, 3, dtype=torch.float64), adv, torch.ones(1, 3), agg="token-mean", **taus
    )
    loss_t.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-_sapo_weight(ratio, 1.0) / 3, _sapo_weight(ratio, 3.0) / 3, 0.0])


@FAST
@given(
    loss_batches,
    st.sampled_from(AGG_MODES),
    st.sampled_from([(1.0, 1.05), (0.5, 2.0), (3.0, 3.0)]),
    st.booleans(),
)
def test_sapo_matches_numpy(data, mode: str, taus: tuple[float, float], weighted: bool) -> None:  # type: ignore[no-untyped-def]
    logp, old, adv, w, mask = _unpack(data)
    weights = w.abs() if weighted else None
    tau_pos, tau_neg = taus
    loss, _ = sapo_policy_loss(
        logp, old, adv, mask, agg=mode, rollout_is_weights=weights, tau_pos=tau_pos, tau_neg=tau_neg
    )
    expected = ref.sapo_loss(
        logp.numpy(),
        old.numpy(),
        adv.numpy(),
        mask.numpy(),
        tau_pos=tau_pos,
        tau_neg=tau_neg,
        mode=mode,
        weights=None if weights is None else weights.numpy(),
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_sapo_refuses_bad_temperatures_and_dual_clip() -> None:
    x = torch.zeros(1, 2)
    for taus, name in (
        ({"tau_pos": -1.0}, "tau_pos"),
        ({"tau_neg": 0.0}, "tau_neg"),
        ({"tau_pos": math.nan}, "tau_pos"),
    ):
        with pytest.raises(ValueError, match=rf"{name} must be a finite temperature > 0 \(the SAPO paper"):
            sapo_policy_loss(x, x, x, x, **taus)
    with pytest.raises(ValueError, match="SAPO has no dual clip"):
        sapo_policy_loss(x, x, x, x, dual_clip=3.0)


def test_sapo_and_gpg_settings_are_checked_at_load() -> None:
    from rlloom.core_rl.config.loading import load_config
    from rlloom.core_rl.config.schema import ConfigError

    sapo = ["model.path=/m", "algorithm.policy_loss.name=sapo"]
    cfg = load_config(
        None, [*sapo, "algorithm.policy_loss.kwargs.tau_pos=1.0", "algorithm.policy_loss.kwargs.tau_neg=2"]
    )
    assert cfg.algorithm.policy_loss.kwargs == {"tau_pos": 1.0, "tau_neg": 2.0}
    with pytest.raises(ConfigError, match=r"algorithm.policy_loss.kwargs: tau_neg must be a finite temperature > 0 "):
        load_config(None, [*sapo, "algorithm.policy_loss.kwargs.tau_neg=-1"])
    with pytest.raises(
        ConfigError, match=r"tau is not a setting of algorithm.policy_loss.name=sapo; its settings: tau_pos, "
    ):
        load_config(None, [*sapo, "algorithm.policy_loss.kwargs={tau: 1.0}"])
    gpg = ["model.path=/m", "algorithm.policy_loss.name=gpg"]
    with pytest.raises(
        ConfigError, match=r"tau_pos is not a setting of algorithm.policy_loss.name=gpg; its settings: none"
    ):
        load_config(None, [*gpg, "algorithm.policy_loss.kwargs.tau_pos=1.0"])
    for base in (sapo, gpg):
        with pytest.raises(ConfigError, match="algorithm.policy_loss.dual_clip: "):
            load_config(None, [*base, "algorithm.policy_loss.dual_clip=3"])
    # veRL keeps the temperatures on the actor: its key gets a hint to ours
    with pytest.raises(ConfigError, match=r"that is veRL's name; here it is algorithm.policy_loss.kwargs.tau_pos "):
        load_config(None, [*sapo, "actor_rollout_ref.actor.tau_pos=1.0"])


def test_the_load_time_loss_probe_checks_values_and_leaves_the_rng_alone() -> None:
    from rlloom.core_rl.config.loading import load_config
    from rlloom.core_rl.config.schema import ConfigError

    clip_cov = ["model.path=/m", "algorithm.policy_loss.name=clip_cov"]
    with pytest.raises(ConfigError, match=r"algorithm.policy_loss.kwargs: clip_cov_ratio must be in \(0, 1\]"):
        load_config(None, [*clip_cov, "algorithm.policy_loss.kwargs.clip_cov_ratio=2"])
    state = torch.get_rng_state()
    # a band around 0 makes the probe's one token a candidate, so clip_cov draws from the RNG
    load_config(None, [*clip_cov, "algorithm.policy_loss.kwargs.clip_cov_lb=-1"])
    assert torch.equal(torch.get_rng_state(), state)
