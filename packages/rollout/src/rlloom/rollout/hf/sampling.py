"""Token sampling for a batch whose rows each carry their own sampling parameters.

A batch mixes requests (a greedy eval prompt next to temperature-1 GRPO samples next to an agent turn with a
seed), so every knob is a per-row tensor and one pass of tensor ops filters the whole batch. The logprob we
return is the one the trainer recomputes: `log_softmax(logits / temperature)` of the sampled token, taken
before top-k/top-p/min-p truncation (as verl and vLLM's default do), so rollout and actor logprobs agree.

Every row's token is read off its cumulative distribution at a uniform number: one `cumsum` and one
`searchsorted` for the whole batch (on a CPU a third of `torch.multinomial`'s time at a 32k vocabulary).
Seeded rows take that number from a counter-based generator, a hash of (their seed, t) for their t-th token,
so a seeded sample depends on nothing but its seed and its own probabilities, whatever batch it shares, and
costs no `torch.Generator` op per row per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlloom.core_rl.contracts.generation import SamplingParams


@dataclass(slots=True)
class RowSampling:
    """Per-row sampling knobs as tensors on the model's device, built once per batch."""

    temperature: torch.Tensor  # [B, 1] float, greedy rows hold 1.0
    greedy: torch.Tensor  # [B] bool
    top_k: torch.Tensor  # [B] long, vocab size when disabled
    top_p: torch.Tensor  # [B] float
    min_p: torch.Tensor  # [B] float
    keys: torch.Tensor  # [B, 2] long, the row's stream (`stream_keys` of its seed); meaningful where `seeded`
    seeded: torch.Tensor  # [B] bool
    counters: torch.Tensor  # [B] long, tokens this row has drawn so far (the position in its stream)
    needs_sort: bool  # any row uses top-k or top-p
    needs_min_p: bool
    scaled: bool  # any row has a temperature other than 1
    all_greedy: bool
    any_greedy: bool
    any_seeded: bool
    all_seeded: bool

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        sample_index: Sequence[int],
        vocab_size: int,
        device: torch.device,
    ) -> RowSampling:
        greedy = [p.temperature == 0.0 for p in params]
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        seeded = [p.seed is not None and p.temperature != 0.0 for p in params]
        seeds = [_row_seed(p.seed, i) if p.seed is not None else 0 for p, i in zip(params, sample_index, strict=True)]
        return cls(
            temperature=torch.tensor(
                [[1.0 if g else p.temperature] for p, g in zip(params, greedy, strict=True)], device=device
            ),
            greedy=torch.tensor(greedy, device=device),
            top_k=torch.tensor(top_k, device=device),
            top_p=torch.tensor([p.top_p for p in params], device=device),
            min_p=torch.tensor([p.min_p for p in params], device=device),
            keys=stream_keys(torch.tensor(seeds, dtype=torch.long, device=device)),
            seeded=torch.tensor(seeded, device=device),
            counters=torch.zeros(len(params), dtype=torch.long, device=device),
            needs_sort=any(k < vocab_size for k in top_k) or any(p.top_p < 1.0 for p in params),
            needs_min_p=any(p.min_p > 0.0 for p in params),
            scaled=any(p.temperature not in (0.0, 1.0) for p in params),
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            any_seeded=any(seeded),
            all_seeded=all(seeded),
        )

    def select(self, keep: torch.Tensor) -> RowSampling:
        """The rows still generating, after finished ones left the batch."""
        return self._with({name: getattr(self, name)[keep] for name in _ROW_TENSORS}, self)

    def place(self, slots: list[int], other: RowSampling) -> RowSampling:
        """`other`'s rows written over the rows at `slots` (finished rows whose places newcomers take)."""
        index = (torch.tensor(slots, device=self.greedy.device),)
        return self._with(
            {name: getattr(self, name).index_put(index, getattr(other, name)) for name in _ROW_TENSORS}, other
        )

    def joined(self, other: RowSampling) -> RowSampling:
        """These rows, then `other`'s."""
        return self._with(
            {name: torch.cat([getattr(self, name), getattr(other, name)]) for name in _ROW_TENSORS}, other
        )

    def _with(self, tensors: dict[str, torch.Tensor], other: RowSampling) -> RowSampling:
        """New rows from per-row `tensors`; the filters' flags stay on if this batch or `other` needed them."""
        greedy, seeded = tensors["greedy"], tensors["seeded"]
        return RowSampling(
            **tensors,
            needs_sort=self.needs_sort or other.needs_sort,
            needs_min_p=self.needs_min_p or other.needs_min_p,
            scaled=self.scaled or other.scaled,
            all_greedy=bool(greedy.all()),
            any_greedy=bool(greedy.any()),
            any_seeded=bool(seeded.any()),
            all_seeded=bool(seeded.all()),
        )


_ROW_TENSORS = ("temperature", "greedy", "top_k", "top_p", "min_p", "keys", "seeded", "counters")
"""`RowSampling`'s per-row fields: what selecting, placing and joining rows must carry along."""


def _row_seed(seed: int, sample_index: int) -> int:
    """Distinct, reproducible streams for the n samples of one seeded request."""
    return (seed * 1_000_003 + sample_index) % (2**63 - 1)


_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit values held in int64, in 16-bit halves so no product overflows."""
    return (x * (c & 0xFFFF) + ((x * (c >> 16)) & 0xFFFF) * 65536) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser: every input bit flips each output bit with probability about 1/2."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def stream_keys(seeds: torch.Tensor) -> torch.Tensor:
    """Two mixed 32-bit keys per seed ([B] -> [B, 2]), computed once per row: together they name its stream."""
    low, high = seeds & _MASK32, (seeds >> 32) & _MASK32
    first = _mix32(low ^ _mix32(high ^ 0x9E3779B9))
    return torch.stack([first, _mix32(high ^ _mix32(first ^ 0x7F4A7C15))], dim=-1)


def counter_uniform(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """A uniform float64 in [0, 1) for each (stream key, counter) pair, 53 random bits, from hashing alone."""
    first, second = keys[:, 0], keys[:, 1]
    high = _mix32(first ^ _mix32((counters & _MASK32) ^ second))
    low = _mix32(high ^ first ^ 0x68E31DA4)
    return (high * 2**21 + (low >> 11)).double() * 2.0**-53


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token whose cumulative-probability interval holds `uniform` (rows [B, V] need not be normalised).

    A token of probability 0 has an empty interval, so it is never returned. A row with no valid distribution
    (NaN or infinite logits) raises instead of yielding an arbitrary token.
    """
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1]
    bad = ~(torch.isfinite(total) & (total > 0))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"row {row} of the batch has no valid sampling distribution (total probability {float(total[row])}): "
            "the model produced NaN or infinite logits; check the weights (a diverged update) or the dtype"
        )
    target = (uniform * total).unsqueeze(-1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return index.clamp_(max=probs.shape[-1] - 1)


def filter_logits(scaled: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """Apply min-p, top-k, then top-p (on the renormalised top-k) per row to temperature-scaled logits ([B, V]).

    Dropped tokens get -inf.
    """
    out = scaled
    if rows.needs_min_p:
        probs = torch.softmax(out, dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * rows.min_p.unsqueeze(-1)
        out = out.masked_fill(probs < threshold, float("-inf"))
    if rows.needs_sort:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        ranks = torch.arange(out.shape[-1], device=out.device).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(ranks >= rows.top_k.unsqueeze(-1), float("-inf"))
        # top-p over the top-k survivors, renormalised (HF's and vLLM's order: k first, then p)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop = mass_before > rows.top_p.unsqueeze(-1)  # the top token always stays (mass_before = 0)
        out = out.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return out


def sample_next(
    logits: torch.Tensor, rows: RowSampling, want_logprobs: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pick one token per row from the last-position logits ([B, V]); return ids [B] and their logprobs [B]."""
    scaled = logits.float()
    if rows.scaled:
        scaled = scaled / rows.temperature
    logp = torch.log_softmax(scaled, dim=-1) if want_logprobs else None
    if rows.all_greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        if rows.needs_sort or rows.needs_min_p:
            probs = torch.softmax(filter_logits(scaled, rows), dim=-1)
        else:  # nothing truncated: reuse the log-softmax the logprobs need anyway
            probs = logp.exp() if logp is not None else torch.softmax(scaled, dim=-1)
        if rows.all_seeded:
            uniform = counter_uniform(rows.keys, rows.counters)
        else:  # torch's global generator (torch.manual_seed) for unseeded rows
            uniform = torch.rand(probs.shape[0], dtype=torch.float64, device=probs.device)
            if rows.any_seeded:
                uniform = torch.where(rows.seeded, counter_uniform(rows.keys, rows.counters), uniform)
        tokens = inverse_cdf(probs, uniform)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, scaled.argmax(dim=-1), tokens)
    rows.counters += 1
    if logp is None:
        return tokens, None
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
