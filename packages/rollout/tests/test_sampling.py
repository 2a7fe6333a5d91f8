"""The per-row sampler: seeded rows drawn from a counter-based generator, checked against hand-computed draws
and the softmax distribution they must follow."""

from __future__ import annotations

import pytest
import torch

from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.rollout.hf.sampling import (
    RowSampling,
    counter_uniform,
    filter_logits,
    inverse_cdf,
    sample_next,
    stream_keys,
)


def test_inverse_cdf_reads_the_interval_holding_the_uniform() -> None:
    probs = torch.tensor([[0.125, 0.0, 0.5, 0.375]]).expand(7, 4)  # exact in binary
    uniform = torch.tensor([0.0, 0.1249, 0.125, 0.6249, 0.625, 0.9999999, 0.35], dtype=torch.float64)
    # intervals: token 0 [0, 0.125), token 1 empty, token 2 [0.125, 0.625), token 3 [0.625, 1)
    assert inverse_cdf(probs, uniform).tolist() == [0, 0, 2, 2, 3, 3, 2]
    unnormalised = torch.tensor([[2.0, 0.0, 6.0]]).expand(3, 3)  # intervals [0, 0.25), empty, [0.25, 1)
    assert inverse_cdf(unnormalised, torch.tensor([0.2, 0.25, 0.9], dtype=torch.float64)).tolist() == [0, 2, 2]


def test_a_row_without_a_distribution_raises_naming_it() -> None:
    probs = torch.tensor([[0.5, 0.5], [float("nan"), 0.5]])
    with pytest.raises(ValueError, match="row 1 .*NaN or infinite logits"):
        inverse_cdf(probs, torch.tensor([0.3, 0.3], dtype=torch.float64))


def test_counter_uniform_is_uniform_and_uncorrelated() -> None:
    seeds = torch.arange(2_000, dtype=torch.long).repeat_interleave(100) * 7_919 + 12_345
    seeds[100:200] += 1 << 40  # seeds that differ only in their high half get their own streams too
    counters = torch.arange(100, dtype=torch.long).repeat(2_000)
    keys = stream_keys(seeds)
    u = counter_uniform(keys, counters)
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    n = u.numel()
    # 64 equal bins: chi-square with 63 degrees of freedom stays under 120 with probability > 0.9999
    observed = torch.histc(u.float(), bins=64, min=0.0, max=1.0)
    chi2 = float(((observed - n / 64) ** 2 / (n / 64)).sum())
    assert chi2 < 120, chi2
    grid = u.view(2_000, 100)
    lag1 = torch.corrcoef(torch.stack([grid[:, :-1].flatten(), grid[:, 1:].flatten()]))[0, 1]
    across_seeds = torch.corrcoef(torch.stack([grid[:-1].flatten(), grid[1:].flatten()]))[0, 1]
    assert abs(float(lag1)) < 0.01 and abs(float(across_seeds)) < 0.01  # 5 standard errors at n ~ 2e5
    assert torch.equal(u, counter_uniform(stream_keys(seeds), counters))  # a pure function of (seed, counter)
    assert not torch.equal(grid[1], counter_uniform(stream_keys(seeds[100:200] - (1 << 40)), counters[:100]))


def _rows(params: list[SamplingParams], vocab: int) -> RowSampling:
    """Each row a request of its own (sample index 0: the seed alone names the stream)."""
    return RowSampling.build(params, [0] * len(params), vocab, torch.device("cpu"))


@pytest.mark.parametrize("seeded", [True, False])
def test_draws_follow_the_softmax(seeded: bool) -> None:
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0, 0.5])
    n = 20_000
    rows = _rows([SamplingParams(temperature=0.7, seed=s if seeded else None) for s in range(n)], logits.numel())
    tokens, logprobs = sample_next(logits.expand(n, -1).clone(), rows, want_logprobs=True)
    expected = torch.softmax(logits / 0.7, dim=-1)
    counts = torch.bincount(tokens, minlength=logits.numel()).double()
    live = expected > 1e-6
    chi2 = float(((counts[live] - n * expected[live]) ** 2 / (n * expected[live])).sum())
    assert chi2 < 25, chi2  # 4 degrees of freedom: P(chi2 > 25) < 1e-4
    assert int(counts[~live].sum()) == 0
    assert logprobs is not None
    assert torch.allclose(logprobs, torch.log(expected)[tokens].float(), atol=1e-5)
    assert int(rows.counters.max()) == 1 and int(rows.counters.min()) == 1


def test_a_seeded_row_draws_the_same_tokens_in_any_batch() -> None:
    torch.manual_seed(0)
    vocab = 50
    steps = [torch.randn(vocab) for _ in range(30)]

    def draw(params: list[SamplingParams], row: int) -> list[int]:
        rows = _rows(params, vocab)
        out = []
        for step in steps:
            batch = step.expand(len(params), -1).clone() + torch.randn(len(params), vocab) * (
                torch.arange(len(params)) != row
            ).unsqueeze(-1)  # the other rows see other logits
            tokens, _ = sample_next(batch, rows, want_logprobs=False)
            out.append(int(tokens[row]))
        return out

    me = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    alone = draw([me], 0)
    crowded = draw([SamplingParams(temperature=0.0), SamplingParams(temperature=1.3), me, SamplingParams(seed=1)], 2)
    assert alone == crowded
    other_seed = draw([me.model_copy(update={"seed": 43})], 0)
    assert other_seed != alone
    assert len(set(alone)) > 5  # it is sampling, not stuck on one token


def test_top_k_leaves_no_mass_outside_the_k_best() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[0.5, 2.0, 1.9, 1.8, 0.0]]).expand(4_000, -1).clone()
    tokens, _ = sample_next(logits, _rows([SamplingParams(top_k=2)] * 4_000, 5), want_logprobs=False)
    counts = torch.bincount(tokens, minlength=5).tolist()
    assert counts[0] == counts[3] == counts[4] == 0
    assert counts[1] > counts[2] > 1_500  # e^2.0 : e^1.9, renormalised over the two


def test_greedy_and_unseeded_rows_beside_seeded_ones() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [50.0, -50.0, -50.0]])
    params = [SamplingParams(temperature=0.0), SamplingParams(seed=3), SamplingParams(temperature=1.0)]
    tokens, _ = sample_next(logits, _rows(params, 3), want_logprobs=False)
    alone, _ = sample_next(logits[1:2], _rows([params[1]], 3), want_logprobs=False)
    assert int(tokens[0]) == 1  # greedy: the argmax
    assert int(tokens[1]) == int(alone[0])  # seeded: as if alone
    assert int(tokens[2]) == 0  # unseeded: the only token with any mass (1 - 2e-43)


def test_top_p_applies_to_the_top_k_survivors_as_transformers_does() -> None:
    """top-k first, then top-p over the renormalised survivors (HF's warper chain and vLLM's sampler)."""
    from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    # hand-computed: top-k=2 leaves [0.4, 0.35] -> [0.533, 0.467]; top-p=0.5 then keeps the first token only
    logits = torch.log(torch.tensor([[0.4, 0.35, 0.25]]))
    kept = torch.isfinite(filter_logits(logits, _rows([SamplingParams(top_k=2, top_p=0.5)], 3)))
    assert kept.tolist() == [[True, False, False]]

    torch.manual_seed(0)
    vocab = 40
    params = [
        SamplingParams(top_k=k, top_p=p, min_p=m)
        for k in (0, 1, 3, 10)
        for p in (0.3, 0.6, 0.95, 1.0)
        for m in (0.0, 0.05)
    ]
    logits = torch.randn(len(params), vocab) * 2.5
    ours = torch.isfinite(filter_logits(logits, _rows(params, vocab)))
    for i, p in enumerate(params):
        ref = logits[i : i + 1].clone()
        if p.min_p:
            ref = MinPLogitsWarper(p.min_p)(None, ref)
        if p.top_k:
            ref = TopKLogitsWarper(p.top_k)(None, ref)
        if p.top_p < 1.0:
            ref = TopPLogitsWarper(p.top_p)(None, ref)
        assert ours[i].tolist() == torch.isfinite(ref[0]).tolist(), p
