"""Loss aggregation modes against their definitions, and gradient accumulation over micro-batches."""

from __future__ import annotations

import algorithms_numpy_reference as ref  # tests/ is on sys.path (conftest)
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlloom.core_rl.algorithms import (
    AGG_MODES,
    LossAggregation,
    aggregate,
    ppo_policy_loss,
    token_and_seq_counts,
)

FAST = settings(max_examples=25, deadline=None)

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 10 + 20) / 5),
        ("seq-mean-token-sum", ((1 + 2 + 3) + (10 + 20)) / 2),  # the empty third row is not a sequence
        ("seq-mean-token-mean", (2.0 + 15.0) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2 + 3) + (10 + 20)) / (2 * 4)),
        ("bnpo", (1 + 2 + 3 + 10 + 20) / 5),  # one micro-batch: its token mean
    ],
)
def test_modes_hand_computed(mode: str, expected: float) -> None:
    assert float(aggregate(LOSS, MASK, mode)) == pytest.approx(expected)


def test_norm_length_is_the_constant_of_dr_grpo() -> None:
    got = aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=100)
    assert float(got) == pytest.approx(36 / (2 * 100))


def test_global_counts_replace_local_ones() -> None:
    assert float(aggregate(LOSS, MASK, "token-mean", global_token_count=36)) == pytest.approx(1.0)
    assert float(aggregate(LOSS, MASK, "seq-mean-token-sum", global_seq_count=6)) == pytest.approx(6.0)


def test_unknown_mode_and_bad_counts_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="Did you mean 'seq-mean-token-mean'"):
        aggregate(LOSS, MASK, "seq-mean-token-man")
    with pytest.raises(ValueError, match="global_token_count must be positive"):
        LossAggregation("token-mean", global_token_count=0)


def test_padding_with_inf_does_not_leak_into_loss_or_gradient() -> None:
    loss = torch.tensor([[1.0, float("inf")], [float("nan"), 3.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [0, 1]])
    out = aggregate(loss, mask, "token-mean")
    out.backward()
    assert float(out.detach()) == pytest.approx(2.0)
    assert loss.grad is not None
    assert torch.equal(loss.grad, torch.tensor([[0.5, 0.0], [0.0, 0.5]]))


batches = st.tuples(st.integers(1, 5), st.integers(1, 7)).flatmap(
    lambda bt: st.tuples(
        st.lists(st.floats(-5, 5, width=32), min_size=bt[0] * bt[1], max_size=bt[0] * bt[1]),
        st.lists(st.integers(0, 1), min_size=bt[0] * bt[1], max_size=bt[0] * bt[1]),
        st.just(bt),
    )
)


@FAST
@given(batches, st.sampled_from(AGG_MODES))
def test_modes_equal_their_definitions(data, mode: str) -> None:  # type: ignore[no-untyped-def]
    values, m, (b, t) = data
    loss = torch.tensor(values, dtype=torch.float64).reshape(b, t)
    mask = torch.tensor(m).reshape(b, t)
    assert float(aggregate(loss, mask, mode)) == pytest.approx(
        ref.aggregate(loss.numpy(), mask.numpy(), mode), abs=1e-9
    )


@FAST
@given(batches, st.sampled_from(AGG_MODES))
def test_masked_tokens_get_exactly_zero_gradient(data, mode: str) -> None:  # type: ignore[no-untyped-def]
    values, m, (b, t) = data
    loss = torch.tensor(values, dtype=torch.float64).reshape(b, t).requires_grad_(True)
    mask = torch.tensor(m).reshape(b, t)
    aggregate(loss, mask, mode).backward()
    assert loss.grad is not None
    assert torch.all(loss.grad[~mask.bool()] == 0)


@FAST
@given(st.integers(0, 10_000), st.sampled_from([m for m in AGG_MODES if m != "bnpo"]), st.integers(1, 5))
def test_micro_batch_gradients_sum_to_the_full_batch_gradient(seed: int, mode: str, micro: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, length = 7, 6
    old = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    logp = (old + 0.3 * torch.randn(batch, length, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    mask = (torch.rand(batch, length, generator=gen) < 0.6).long()
    mask[0] = 0  # a fully masked row (e.g. overlong-filtered) must not count as a sequence anywhere
    kw = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}

    full, _ = ppo_policy_loss(logp, old, adv, mask, agg=LossAggregation(mode, norm_length=length), **kw)
    (full_grad,) = torch.autograd.grad(full, logp)

    tokens, seqs = token_and_seq_counts(mask)
    agg = LossAggregation(mode, global_token_count=tokens, global_seq_count=seqs, norm_length=length)
    accumulated = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(batch).tensor_split(micro):
        part, _ = ppo_policy_loss(logp[rows], old[rows], adv[rows], mask[rows], agg=agg, **kw)
        part.backward()
        accumulated = accumulated + part.detach()
    assert logp.grad is not None
    torch.testing.assert_close(accumulated, full.detach())
    torch.testing.assert_close(logp.grad, full_grad)


def test_per_micro_batch_token_mean_is_not_the_full_batch_mean() -> None:
    """The pitfall the global count fixes: averaging micro-batch token-means over-weights short micro-batches."""
    loss = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    naive = (aggregate(loss[:1], mask[:1]) + aggregate(loss[1:], mask[1:])) / 2
    correct = aggregate(loss[:1], mask[:1], global_token_count=4) + aggregate(loss[1:], mask[1:], global_token_count=4)
    assert float(aggregate(loss, mask)) == pytest.approx(7 / 4) == pytest.approx(float(correct))
    assert float(naive) == pytest.approx(2.5)


def test_bnpo_is_the_mean_of_micro_batch_token_means_as_trl_accumulates_it() -> None:
    """TRL's bnpo: each micro-batch's token mean, divided by the accumulation steps (and averaged by DDP over
    devices): with M micro-batches over all ranks the summed parts are the mean of the M token means."""
    loss = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0], [2.0, 6.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    parts = [aggregate(loss[r], mask[r], "bnpo", global_micro_batch_count=2) for r in (slice(0, 2), slice(2, 3))]
    assert float(sum(parts)) == pytest.approx(((3 + 4) / 4 + (2 + 6) / 2) / 2)  # (1.75 + 4) / 2
    # and it is not the token mean of the whole mini-batch, which weighs every token the same
    assert float(aggregate(loss, mask, "token-mean")) == pytest.approx(15 / 6)
    with pytest.raises(ValueError, match="global_micro_batch_count must be positive"):
        LossAggregation("bnpo", global_micro_batch_count=0)
