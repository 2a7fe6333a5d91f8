"""DAPO filters (zero-variance groups, overlong) and rollout/trainer mismatch (TIS weights, metrics)."""

from __future__ import annotations

import math

import pytest
import torch

from rlloom.core_rl.algorithms import (
    filter_groups_by_mean,
    filter_zero_variance_groups,
    high_entropy_token_mask,
    mask_truncated_responses,
    mismatch_metrics,
    overlong_reward_penalty,
    ppo_policy_loss,
    tis_weights,
    truncated_responses,
)

# ---- DAPO dynamic sampling -------------------------------------------------------------------------------------


def test_zero_variance_groups_are_dropped() -> None:
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 3.0])
    ids = ["a", "a", "a", "b", "b", "c", "c", "d"]
    keep = filter_zero_variance_groups(scores, ids)
    assert keep.tolist() == [False, False, False, True, True, False, False, True]
    keep_no_single = filter_zero_variance_groups(scores, ids, keep_singletons=False)
    assert keep_no_single.tolist() == [False, False, False, True, True, False, False, False]


def test_zero_variance_filter_agrees_with_a_loop_over_groups() -> None:
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 2, (64,), generator=gen).float()
    ids = torch.randint(0, 12, (64,), generator=gen)
    keep = filter_zero_variance_groups(scores, ids, keep_singletons=False)
    for g in ids.unique():
        members = scores[ids == g]
        varied = members.numel() > 1 and bool((members != members[0]).any())
        assert bool(keep[ids == g].all()) == varied and bool(keep[ids == g].any()) == varied


# ---- overlong filtering and shaping ----------------------------------------------------------------------------


def test_truncated_responses_and_mask() -> None:
    eos = 2
    ids = torch.tensor([[5, 6, 2, 0], [5, 6, 7, 8], [5, 2, 0, 0], [9, 9, 0, 2]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]])  # row 3's eos is padding
    truncated = truncated_responses(ids, mask, eos)
    assert truncated.tolist() == [False, True, False, True]
    assert truncated_responses(ids, mask, [2, 8]).tolist() == [False, False, False, True]
    new_mask = mask_truncated_responses(mask, truncated)
    assert new_mask.tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]


def test_overlong_filtered_rows_contribute_no_gradient() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = mask_truncated_responses(torch.ones(2, 3), torch.tensor([False, True]))
    loss, _ = ppo_policy_loss(logp, torch.zeros(2, 3), torch.ones(2, 3), mask, clip_low=0.2, clip_high=0.2)
    loss.backward()
    assert logp.grad is not None
    assert torch.equal(logp.grad[1], torch.zeros(3)) and torch.all(logp.grad[0] != 0)


def test_soft_overlong_penalty_dapo_eq13() -> None:
    lengths = torch.tensor([10, 16, 18, 20, 25])
    got = overlong_reward_penalty(lengths, max_length=20, buffer_length=4, penalty_factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_reward_penalty(lengths, max_length=20, buffer_length=0)


def test_mean_band_filter_hand_computed() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 1.0, 0.25, 0.0])
    ids = ["a", "a", "b", "b", "c", "c", "d", "e", "e"]
    # means: a 1.0 (always solved), b 0.0 (never), c 0.25, d 1.0 (singleton), e 0.125
    keep = filter_groups_by_mean(scores, ids, low=0.01, high=0.99)
    assert keep.tolist() == [False, False, False, False, True, True, False, True, True]
    # the band is open: a mean equal to a bound is dropped
    assert filter_groups_by_mean(scores, ids, low=0.125, high=0.99).tolist()[7:] == [False, False]
    with pytest.raises(ValueError, match="low < high"):
        filter_groups_by_mean(scores, ids, low=0.5, high=0.5)


# ---- TIS and mismatch metrics ----------------------------------------------------------------------------------


def test_tis_weights_hand_computed() -> None:
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.3]]))
    rollout = torch.log(torch.tensor([[0.5, 0.3, 0.4, 0.1]]))
    mask = torch.tensor([[1, 1, 1, 0]])
    w = tis_weights(old.requires_grad_(True), rollout, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.5, 0.0]]))  # 0.9/0.3 = 3 is capped at C = 2
    assert not w.requires_grad


def test_tis_weights_never_overflow() -> None:
    w = tis_weights(torch.tensor([[0.0]]), torch.tensor([[-500.0]]), torch.ones(1, 1), cap=5.0)
    assert float(w) == pytest.approx(5.0)


def test_tis_weights_scale_the_policy_loss() -> None:
    logp, old, adv, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    plain, _ = ppo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    weighted, _ = ppo_policy_loss(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.2, rollout_is_weights=torch.tensor([[2.0, 0.5]])
    )
    assert float(plain) == pytest.approx(-1.0) and float(weighted) == pytest.approx(-1.25)


def test_mismatch_metrics_hand_computed() -> None:
    old = torch.log(torch.tensor([[0.5, 0.6, 0.9]]))
    rollout = torch.log(torch.tensor([[0.5, 0.3, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])
    m = mismatch_metrics(old, rollout, mask, cap=1.5)
    d = math.log(2.0)  # token 1: log(0.6/0.3)
    assert float(m["mismatch_kl_k1"]) == pytest.approx(-d / 2)
    assert float(m["mismatch_kl_k3"]) == pytest.approx((2.0 - d - 1.0) / 2)
    assert float(m["mismatch_abs_logprob_diff_mean"]) == pytest.approx(d / 2)
    assert float(m["mismatch_abs_logprob_diff_max"]) == pytest.approx(d)  # the masked 9× token is ignored
    assert float(m["mismatch_ratio_mean"]) == pytest.approx(1.5)
    assert float(m["tis_capped_frac"]) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("mode", "expected", "capped"),
    [
        # token ratios 1, 3, 0.5 | 4 (the masked 9x token never counts)
        ("token_truncate", [[1.0, 2.0, 0.5, 0.0], [2.0, 0.0, 0.0, 0.0]], 2 / 4),
        ("token_mask", [[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]], 2 / 4),
        # sequence ratios 1 * 3 * 0.5 = 1.5 and 4
        ("sequence_truncate", [[1.5, 1.5, 1.5, 0.0], [2.0, 0.0, 0.0, 0.0]], 1 / 2),
        ("sequence_mask", [[1.5, 1.5, 1.5, 0.0], [0.0, 0.0, 0.0, 0.0]], 1 / 2),
    ],
)
def test_tis_modes_hand_computed(mode: str, expected: list[list[float]], capped: float) -> None:
    """TRL's vllm_importance_sampling_mode variants: per-token or per-sequence ratio, truncated or masked."""
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.9], [0.8, 0.9, 0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.5, 0.3, 0.4, 0.1], [0.2, 0.1, 0.5, 0.5]]))
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    weights = tis_weights(old, rollout, mask, cap=2.0, mode=mode)
    torch.testing.assert_close(weights, torch.tensor(expected))
    assert float(mismatch_metrics(old, rollout, mask, cap=2.0, mode=mode)["tis_capped_frac"]) == pytest.approx(capped)


def test_tis_unknown_mode_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="token_truncate, token_mask, sequence_truncate, sequence_mask"):
        tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=2.0, mode="sequence")


def test_high_entropy_token_mask_keeps_the_top_fraction_of_valid_tokens() -> None:
    entropy = torch.tensor([[0.1, 0.9, 0.4, 5.0], [0.7, 0.2, 0.3, 0.6]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # the 5.0 is padding: it must neither count nor be kept
    # valid entropies sorted: 0.1 0.2 0.3 0.4 0.6 0.7 0.9; the 0.6 quantile (top 40%) interpolates at
    # position 0.6 * 6 = 3.6: 0.4 + 0.6 * (0.6 - 0.4) = 0.52, so 0.6, 0.7 and 0.9 are kept
    keep = high_entropy_token_mask(entropy, mask, top_fraction=0.4)
    assert keep.tolist() == [[False, True, False, False], [True, False, False, True]]
    assert high_entropy_token_mask(entropy, mask, top_fraction=1.0).tolist() == mask.bool().tolist()
    assert not high_entropy_token_mask(entropy, torch.zeros_like(mask), top_fraction=0.2).any()
    with pytest.raises(ValueError, match="top_fraction"):
        high_entropy_token_mask(entropy, mask, top_fraction=0.0)


def test_high_entropy_token_mask_agrees_with_torch_quantile_and_takes_batches_it_refuses() -> None:
    gen = torch.Generator().manual_seed(0)
    entropy, mask = torch.rand(6, 50, generator=gen), torch.rand(6, 50, generator=gen) > 0.3
    for fraction in (0.05, 0.2, 0.5, 0.999):
        threshold = torch.quantile(entropy[mask], 1.0 - fraction)
        assert (
            high_entropy_token_mask(entropy, mask, top_fraction=fraction).tolist()
            == (mask & (entropy >= threshold)).tolist()
        )
    # 2**24 + 2 valid tokens, more than torch.quantile takes: half of them 0, half 1; the 0.75 quantile is 1
    half = 2**23 + 1
    big = torch.stack([torch.zeros(half), torch.ones(half)])
    keep = high_entropy_token_mask(big, torch.ones_like(big, dtype=torch.bool), top_fraction=0.25)
    assert keep[1].all() and not keep[0].any()


def test_identical_engines_show_no_mismatch() -> None:
    lp = torch.log(torch.rand(4, 6) + 0.01)
    m = mismatch_metrics(lp, lp.clone(), torch.ones(4, 6))
    assert float(m["mismatch_kl_k1"]) == 0.0 and float(m["mismatch_kl_k3"]) == 0.0
    assert float(m["mismatch_ratio_mean"]) == 1.0
