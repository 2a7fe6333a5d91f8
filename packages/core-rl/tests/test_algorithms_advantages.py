"""Advantage estimators against hand-computed cases, the independent numpy reference, and properties."""

from __future__ import annotations

import algorithms_numpy_reference as ref  # tests/ is on sys.path (conftest)
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlloom.core_rl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    UnknownNameError,
    gae_advantages,
    get_advantage_estimator,
    gpg_advantages,
    grpo_advantages,
    grpo_passk_advantages,
    masked_whiten,
    opo_advantages,
    register_advantage,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
    rloo_advantages,
)

FAST = settings(max_examples=25, deadline=None)


# ---- GRPO / Dr.GRPO / RLOO / ReMax: hand-computed -------------------------------------------------------------


def test_grpo_hand_computed() -> None:
    # group a = [1, 0, 1]: mean 2/3, Bessel std sqrt(1/3); group b is a singleton → 0.
    scores = torch.tensor([1.0, 0.0, 1.0, 5.0])
    adv = grpo_advantages(scores, ["a", "a", "a", "b"], eps=0.0)
    s = (1 / 3) ** 0.5
    torch.testing.assert_close(adv, torch.tensor([(1 / 3) / s, (-2 / 3) / s, (1 / 3) / s, 0.0]))


def test_dr_grpo_skips_std() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 5.0]), torch.tensor([7, 7, 7, 9]), norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0]))


def test_grpo_batch_std_hand_computed() -> None:
    # group means: a = 0.5, b = 2; whole-batch scores [1, 0, 2, 2]: mean 1.25, Bessel variance
    # (0.0625 + 1.5625 + 0.5625 + 0.5625) / 3 = 2.75 / 3
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0])
    adv = grpo_advantages(scores, ["a", "a", "b", "b"], eps=0.0, std_scope="batch")
    s = (2.75 / 3) ** 0.5
    torch.testing.assert_close(adv, torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]))
    with pytest.raises(ValueError, match="std_scope"):
        grpo_advantages(scores, ["a", "a", "b", "b"], std_scope="global")


def test_grpo_std_matches_torch_std() -> None:
    scores = torch.tensor([0.3, 1.7, -2.0, 4.0])
    adv = grpo_advantages(scores, [0, 0, 0, 0], eps=1e-6)
    torch.testing.assert_close(adv, (scores - scores.mean()) / (scores.std() + 1e-6))


def test_grpo_equal_scores_give_zero_not_nan() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), ["u", "u", "u"])
    assert torch.equal(adv, torch.zeros(3))


def test_grpo_passk_hand_computed() -> None:
    # group a: best 3, runner-up 2 → gap 1; group b is a tie → gap 0; the singleton c → 0
    scores = torch.tensor([1.0, 3.0, 2.0, 4.0, 4.0, 9.0])
    ids = ["a", "a", "a", "b", "b", "c"]
    got = grpo_passk_advantages(scores, ids, norm_by_std=False)
    torch.testing.assert_close(got, torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    normed = grpo_passk_advantages(scores, ids, eps=0.0)
    torch.testing.assert_close(normed[1], torch.tensor(1.0))  # std of [1, 3, 2] is 1


def test_rloo_hand_computed() -> None:
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 1.0, 5.0, 2.0, 4.0]), ["a", "a", "a", "b", "c", "c"])
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.0, 0.5, 0.0, -2.0, 2.0]))


def test_gpg_hand_computed() -> None:
    # 6 responses, 2 non-zero scores → α = 6/2 = 3; group a mean 1/3, group b mean 0 (all equal), c mean 1
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    adv = gpg_advantages(scores, ["a", "a", "a", "b", "b", "c"])
    # c is a singleton → 0; b has no spread → 0
    torch.testing.assert_close(adv, torch.tensor([2.0, -1.0, -1.0, 0.0, 0.0, 0.0]))
    # F_norm divides; an all-zero batch has α = B / 1 and still gives 0 (no spread anywhere)
    torch.testing.assert_close(gpg_advantages(scores, ["a"] * 3 + ["b"] * 3, f_norm=2.0), 3 / 2 * (scores - 1 / 3))
    torch.testing.assert_close(gpg_advantages(torch.zeros(4), ["a"] * 4), torch.zeros(4))
    with pytest.raises(ValueError, match="f_norm must be > 0"):
        gpg_advantages(scores, ["a"] * 6, f_norm=0.0)


def test_gpg_alpha_counts_non_zero_scores_of_the_whole_batch() -> None:
    # the same group gets a larger advantage when the rest of the batch scored 0 (veRL's α), and negative scores count
    group = [1.0, 0.0]
    alone = gpg_advantages(torch.tensor(group), ["a", "a"])
    with_zeros = gpg_advantages(torch.tensor([*group, 0.0, 0.0]), ["a", "a", "b", "b"])
    torch.testing.assert_close(alone, torch.tensor([1.0, -1.0]))  # α = 2/1
    torch.testing.assert_close(with_zeros[:2], 2 * alone)  # α = 4/1
    negative = gpg_advantages(torch.tensor([1.0, -1.0, 0.0, 0.0]), ["a", "a", "b", "b"])
    torch.testing.assert_close(negative, torch.tensor([2.0, -2.0, 0.0, 0.0]))  # α = 4/2


def test_remax_hand_computed() -> None:
    adv = remax_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]))


def test_integer_and_bf16_inputs_give_float_advantages() -> None:
    adv = grpo_advantages(torch.tensor([1, 0, 1, 0]), [0, 0, 0, 0])
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), [0, 0, 0, 0]))
    gae_adv, _ = gae_advantages(
        torch.tensor([[0.0, 1.0]]).bfloat16(), torch.zeros(1, 2).bfloat16(), torch.ones(1, 2), gamma=1.0, lam=1.0
    )
    assert gae_adv.dtype == torch.float32


def test_group_ids_tensor_list_and_numpy_agree() -> None:
    scores = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    ids = ["p1", "p2", "p1", "p2", "p1"]
    as_list = grpo_advantages(scores, ids)
    as_tensor = grpo_advantages(scores, torch.tensor([10, 20, 10, 20, 10]))
    as_numpy = grpo_advantages(scores, np.array(ids, dtype=object))
    torch.testing.assert_close(as_list, as_tensor)
    torch.testing.assert_close(as_list, as_numpy)


def test_group_ids_length_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="group_ids has 2 entries but the batch has 3"):
        grpo_advantages(torch.zeros(3), ["a", "b"])


# ---- GRPO / RLOO: against numpy and properties ------------------------------------------------------------------

scores_and_groups = st.integers(min_value=1, max_value=24).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=n, max_size=n),
        st.lists(st.integers(0, 4), min_size=n, max_size=n),
    )
)


@FAST
@given(scores_and_groups, st.booleans())
def test_grpo_matches_numpy(data: tuple[list[float], list[int]], norm: bool) -> None:
    scores, groups = data
    got = grpo_advantages(torch.tensor(scores, dtype=torch.float64), groups, norm_by_std=norm)
    np.testing.assert_allclose(got.numpy(), ref.grpo(scores, groups, norm_by_std=norm), rtol=1e-9, atol=1e-9)


@FAST
@given(scores_and_groups)
def test_grpo_advantages_are_zero_mean_per_group(data: tuple[list[float], list[int]]) -> None:
    scores, groups = data
    adv = grpo_advantages(torch.tensor(scores, dtype=torch.float64), groups)
    for g in set(groups):
        members = [i for i, x in enumerate(groups) if x == g]
        assert abs(float(adv[members].sum())) < 1e-6 * max(1, len(members))


@FAST
@given(scores_and_groups)
def test_rloo_matches_numpy_and_is_zero_mean(data: tuple[list[float], list[int]]) -> None:
    scores, groups = data
    got = rloo_advantages(torch.tensor(scores, dtype=torch.float64), groups)
    np.testing.assert_allclose(got.numpy(), ref.rloo(scores, groups), rtol=1e-9, atol=1e-9)
    for g in set(groups):
        members = [i for i, x in enumerate(groups) if x == g]
        assert abs(float(got[members].sum())) < 1e-8 * max(1.0, float(np.abs(scores).max()) * len(members))


@FAST
@given(scores_and_groups, st.sampled_from([1.0, 0.5, 3.0]))
def test_gpg_matches_numpy(data: tuple[list[float], list[int]], f_norm: float) -> None:
    scores, groups = data
    got = gpg_advantages(torch.tensor(scores, dtype=torch.float64), groups, f_norm=f_norm)
    np.testing.assert_allclose(got.numpy(), ref.gpg(scores, groups, f_norm=f_norm), rtol=1e-9, atol=1e-9)


def test_opo_hand_computed() -> None:
    # group a: lengths 1, 3 → baseline (1·1 + 3·0)/4 = 0.25; singleton b → 0
    adv = opo_advantages(torch.tensor([1.0, 0.0, 7.0]), ["a", "a", "b"], torch.tensor([1, 3, 5]))
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, 0.0]))


@FAST
@given(scores_and_groups, st.data())
def test_opo_matches_numpy(data: tuple[list[float], list[int]], draw: st.DataObject) -> None:
    scores, groups = data
    lengths = draw.draw(st.lists(st.integers(0, 50), min_size=len(scores), max_size=len(scores)))
    got = opo_advantages(torch.tensor(scores, dtype=torch.float64), groups, torch.tensor(lengths))
    np.testing.assert_allclose(got.numpy(), ref.opo(scores, groups, lengths), rtol=1e-9, atol=1e-9)


@FAST
@given(scores_and_groups, st.booleans())
def test_grpo_passk_matches_numpy(data: tuple[list[float], list[int]], norm: bool) -> None:
    scores, groups = data
    got = grpo_passk_advantages(torch.tensor(scores, dtype=torch.float64), groups, norm_by_std=norm)
    np.testing.assert_allclose(got.numpy(), ref.grpo_passk(scores, groups, norm_by_std=norm), rtol=1e-9, atol=1e-9)


# ---- GAE ----------------------------------------------------------------------------------------------------------


def test_gae_hand_computed() -> None:
    # δ2 = 1 − .5 = .5; δ1 = 0 + .5·.5 − .5 = −.25; δ0 = −.25; A2 = .5, A1 = −.25 + .25·.5, A0 = −.25 + .25·A1
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.28125, -0.125, 0.5]]))
    torch.testing.assert_close(ret, torch.tensor([[0.21875, 0.375, 1.0]]))


def test_gae_interior_mask_is_skipped_hand_computed() -> None:
    # The same sequence with a tool-observation token (value 9, mask 0) inserted: it is invisible.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 9.0, 0.5, 0.5, 3.0]])
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.28125, 0.0, -0.125, 0.5, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.21875, 0.0, 0.375, 1.0, 0.0]]))


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value() -> None:
    rewards = torch.tensor([[0.0, 0.2, 0.0, 1.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    adv, _ = gae_advantages(rewards, values, torch.ones(1, 4), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[1.2, 1.2, 1.0, 1.0]]) - values)


batch_tensors = st.tuples(st.integers(1, 4), st.integers(1, 9)).flatmap(
    lambda bt: st.tuples(
        st.lists(st.floats(-3, 3, width=32), min_size=bt[0] * bt[1], max_size=bt[0] * bt[1]),
        st.lists(st.floats(-3, 3, width=32), min_size=bt[0] * bt[1], max_size=bt[0] * bt[1]),
        st.lists(st.integers(0, 1), min_size=bt[0] * bt[1], max_size=bt[0] * bt[1]),
        st.just(bt),
    )
)


def _tensors(data):  # type: ignore[no-untyped-def]
    r, v, m, (b, t) = data
    mask = torch.tensor(m).reshape(b, t)
    rewards = torch.tensor(r, dtype=torch.float64).reshape(b, t) * mask
    return rewards, torch.tensor(v, dtype=torch.float64).reshape(b, t), mask


@FAST
@given(batch_tensors, st.floats(0, 1), st.floats(0, 1))
def test_gae_matches_numpy_with_arbitrary_masks(data, gamma: float, lam: float) -> None:  # type: ignore[no-untyped-def]
    rewards, values, mask = _tensors(data)
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = ref.gae(rewards.numpy(), values.numpy(), mask.numpy(), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-9, atol=1e-9)


@FAST
@given(batch_tensors, st.floats(0, 1), st.floats(0, 1))
def test_gae_with_interior_masks_equals_gae_on_the_compressed_sequence(data, gamma: float, lam: float) -> None:  # type: ignore[no-untyped-def]
    rewards, values, mask = _tensors(data)
    adv, _ = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    for b in range(mask.shape[0]):
        keep = mask[b].bool()
        if not keep.any():
            assert torch.equal(adv[b], torch.zeros_like(adv[b]))
            continue
        compact, _ = gae_advantages(
            rewards[b, keep][None], values[b, keep][None], torch.ones(1, int(keep.sum())), gamma=gamma, lam=lam
        )
        torch.testing.assert_close(adv[b, keep], compact[0])
        assert torch.equal(adv[b, ~keep], torch.zeros_like(adv[b, ~keep]))


def test_gae_refuses_rewards_on_masked_tokens() -> None:
    with pytest.raises(ValueError, match="non-zero values where mask is 0"):
        gae_advantages(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), torch.tensor([[1, 0]]), gamma=1.0, lam=1.0)


def test_gae_shape_mismatch_names_the_fields() -> None:
    with pytest.raises(ValueError, match=r"values\(1, 3\)"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), gamma=1.0, lam=1.0)


# ---- REINFORCE++ and its baseline variant -------------------------------------------------------------------------


def test_reinforce_pp_hand_computed() -> None:
    # G = [[1, 1], [3, 3]]: mean 2, Bessel std sqrt(4/3) → ±sqrt(3)/2.
    adv, ret = reinforce_pp_advantages(torch.tensor([[0.0, 1.0], [0.0, 3.0]]), torch.ones(2, 2), gamma=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0], [3.0, 3.0]]))
    h = 3**0.5 / 2
    torch.testing.assert_close(adv, torch.tensor([[-h, -h], [h, h]]), rtol=1e-5, atol=1e-5)


@FAST
@given(batch_tensors, st.floats(0, 1))
def test_reinforce_pp_matches_numpy(data, gamma: float) -> None:  # type: ignore[no-untyped-def]
    rewards, _, mask = _tensors(data)
    if int(mask.sum()) < 2:
        with pytest.raises(ValueError, match="at least 2 valid entries"):
            reinforce_pp_advantages(rewards, mask, gamma=gamma)
        return
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma=gamma)
    ref_adv, ref_ret = ref.reinforce_pp(rewards.numpy(), mask.numpy(), gamma)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-6, atol=1e-6)


def test_reinforce_pp_baseline_matches_numpy() -> None:
    scores = torch.tensor([1.0, 0.0, 1.0, 3.0, 2.0], dtype=torch.float64)
    ids = ["a", "a", "a", "b", "b"]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 1]])
    got = reinforce_pp_baseline_advantages(scores, ids, mask)
    np.testing.assert_allclose(got.numpy(), ref.reinforce_pp_baseline(scores.tolist(), ids, mask.numpy()), atol=1e-9)


def test_masked_whiten_ignores_padding() -> None:
    values = torch.tensor([[1.0, 3.0, 1e6]])
    out = masked_whiten(values, torch.tensor([[1, 1, 0]]))
    h = 1 / 2**0.5  # mean 2, Bessel std sqrt(2)
    torch.testing.assert_close(out, torch.tensor([[-h, h, 0.0]]), rtol=1e-5, atol=1e-5)


# ---- registry ---------------------------------------------------------------------------------------------------


def test_registered_outcome_estimators_broadcast_over_tokens() -> None:
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    inputs = AdvantageInputs(rewards, mask, group_ids=["a", "a", "a"])
    scores = torch.tensor([1.0, 0.0, 2.0])
    for name, expected in [
        ("grpo", grpo_advantages(scores, ["a"] * 3)),
        ("dr_grpo", grpo_advantages(scores, ["a"] * 3, norm_by_std=False)),
        ("rloo", rloo_advantages(scores, ["a"] * 3)),
        ("opo", opo_advantages(scores, ["a"] * 3, mask.sum(-1))),
        ("grpo_passk", grpo_passk_advantages(scores, ["a"] * 3)),
        ("gpg", gpg_advantages(scores, ["a"] * 3)),
    ]:
        adv, ret = get_advantage_estimator(name)(inputs)
        torch.testing.assert_close(adv, expected[:, None] * mask)
        torch.testing.assert_close(ret, adv)
    baseline_adv = get_advantage_estimator("reinforce_plus_plus_baseline")(inputs)[0]
    torch.testing.assert_close(baseline_adv, reinforce_pp_baseline_advantages(scores, ["a"] * 3, mask))


def test_registered_gae_remax_and_reinforce_pp() -> None:
    rewards = torch.tensor([[0.0, 0.5, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    inputs = AdvantageInputs(rewards, mask, values=values, baseline_scores=torch.tensor([1.0, 1.0]), gamma=0.9)
    # veRL whitens GAE advantages over the batch; the returns (critic targets) stay A + V, un-whitened
    gae_adv, gae_ret = get_advantage_estimator("gae")(inputs)
    ref_adv, ref_ret = ref.gae(rewards.numpy(), values.numpy(), mask.numpy(), gamma=0.9, lam=1.0)
    torch.testing.assert_close(gae_adv, torch.tensor(ref.whiten(ref_adv, mask.numpy()), dtype=torch.float32))
    torch.testing.assert_close(gae_ret, torch.tensor(ref_ret, dtype=torch.float32))
    valid = mask.bool()
    assert abs(float(gae_adv[valid].mean())) < 1e-6 and float(gae_adv[valid].std()) == pytest.approx(1.0, abs=1e-4)
    remax_adv, remax_ret = get_advantage_estimator("remax")(inputs)
    torch.testing.assert_close(remax_ret, torch.tensor([[1.5, 1.5, 1.0], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(remax_adv, torch.tensor([[0.5, 0.5, 0.0], [1.0, 1.0, 0.0]]))
    torch.testing.assert_close(
        get_advantage_estimator("reinforce_plus_plus")(inputs)[0],
        reinforce_pp_advantages(rewards, mask, gamma=0.9)[0],
    )


def test_missing_inputs_are_named() -> None:
    inputs = AdvantageInputs(torch.zeros(2, 2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="needs values from a critic"):
        get_advantage_estimator("gae")(inputs)
    with pytest.raises(ValueError, match="needs group_ids"):
        get_advantage_estimator("grpo")(inputs)
    with pytest.raises(ValueError, match="needs baseline_scores"):
        get_advantage_estimator("remax")(inputs)


def test_unknown_estimator_lists_names_and_nearest() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown advantage estimator 'gpro'\. Did you mean 'grpo'\?.*rloo"):
        get_advantage_estimator("gpro")


def test_a_new_estimator_is_one_decorated_function() -> None:
    @register_advantage("test_only_score_as_advantage")
    def score_as_advantage(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        adv = inputs.scores()[:, None] * inputs.mask
        return adv, adv

    try:
        adv, _ = get_advantage_estimator("test_only_score_as_advantage")(
            AdvantageInputs(torch.tensor([[0.0, 2.0]]), torch.ones(1, 2))
        )
        torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0]]))
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("grpo")(score_as_advantage)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_only_score_as_advantage")
    assert "test_only_score_as_advantage" not in ADVANTAGE_ESTIMATORS


def test_gae_gives_wrong_answers_a_negative_advantage_from_a_fresh_critic() -> None:
    """Outcome rewards 1 (right) and 0 (wrong), critic values all 0 (the zero-initialised value head), γ = λ = 1:
    raw GAE is 1 on every right token and 0 on every wrong one; whitened (veRL), the wrong answer is pushed down.
    By hand: tokens 1,1,1,0,0 (right: 3 tokens, wrong: 2), mean 0.6, Bessel var 0.3, so right (1 − 0.6)/√0.3 and
    wrong −0.6/√0.3."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, returns = get_advantage_estimator("gae")(AdvantageInputs(rewards, mask, values=torch.zeros(2, 3)))
    right, wrong = 0.4 / 0.3**0.5, -0.6 / 0.3**0.5
    torch.testing.assert_close(adv, torch.tensor([[right, right, right], [wrong, wrong, 0.0]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    one_token = AdvantageInputs(torch.tensor([[2.0, 0.0]]), torch.tensor([[1, 0]]), values=torch.zeros(1, 2))
    torch.testing.assert_close(get_advantage_estimator("gae")(one_token)[0], torch.tensor([[2.0, 0.0]]))  # no var


def test_adv_epsilon_reaches_grpo_through_the_config() -> None:
    """algorithm.advantage.epsilon (TRL's 1e-4, veRL's 1e-6) is the divisor's epsilon the advantage phase uses."""
    from rlloom.core_rl.algorithms.kl_control import FixedKLController
    from rlloom.core_rl.config.schema import AlgorithmConfig
    from rlloom.core_rl.contracts.batch import TrajectoryBatch
    from rlloom.core_rl.contracts.trajectory import Trajectory
    from rlloom.core_rl.phases.advantages import compute_advantages

    rewards = [1.0, 0.0, 0.0, 0.0]
    trajs = [Trajectory(prompt_ids=[1], response_ids=[2], loss_mask=[1], group_id="g", reward=r) for r in rewards]
    for eps in (1e-6, 1e-4, 0.5):
        batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=0)
        compute_advantages(batch, trajs, AlgorithmConfig(adv_epsilon=eps), FixedKLController(0.0))
        std = torch.tensor(rewards).std().item()  # torch's unbiased std, as GRPO here
        expected = [(r - 0.25) / (std + eps) for r in rewards]
        torch.testing.assert_close(batch["advantages"][:, 0], torch.tensor(expected))
