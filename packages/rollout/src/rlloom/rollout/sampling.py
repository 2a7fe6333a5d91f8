"""Token sampling for a batch whose rows each carry their own sampling parameters.

A batch mixes requests (a greedy eval prompt next to temperature-1 GRPO samples next to an agent turn with a
seed), so every knob is a per-row tensor and one pass of tensor ops filters the whole batch. The logprob we
return is the one the trainer recomputes: `log_softmax(logits / temperature)` of the sampled token, taken
before top-k/top-p/min-p truncation (as verl and vLLM's default do), so rollout and actor logprobs agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlloom.core_rl.generation import SamplingParams


@dataclass(slots=True)
class RowSampling:
    """Per-row sampling knobs as tensors on the model's device, built once per batch."""

    temperature: torch.Tensor  # [B, 1] float, greedy rows hold 1.0
    greedy: torch.Tensor  # [B] bool
    top_k: torch.Tensor  # [B] long, vocab size when disabled
    top_p: torch.Tensor  # [B] float
    min_p: torch.Tensor  # [B] float
    generators: list[torch.Generator | None]  # one per row when its request has a seed
    needs_sort: bool  # any row uses top-k or top-p
    needs_min_p: bool
    scaled: bool  # any row has a temperature other than 1
    all_greedy: bool
    any_greedy: bool

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
        generators: list[torch.Generator | None] = []
        for p, i in zip(params, sample_index, strict=True):
            if p.seed is None or p.temperature == 0.0:
                generators.append(None)
                continue
            gen = torch.Generator(device=device)
            gen.manual_seed(_row_seed(p.seed, i))
            generators.append(gen)
        return cls(
            temperature=torch.tensor(
                [[1.0 if g else p.temperature] for p, g in zip(params, greedy, strict=True)], device=device
            ),
            greedy=torch.tensor(greedy, device=device),
            top_k=torch.tensor(top_k, device=device),
            top_p=torch.tensor([p.top_p for p in params], device=device),
            min_p=torch.tensor([p.min_p for p in params], device=device),
            generators=generators,
            needs_sort=any(k < vocab_size for k in top_k) or any(p.top_p < 1.0 for p in params),
            needs_min_p=any(p.min_p > 0.0 for p in params),
            scaled=any(p.temperature not in (0.0, 1.0) for p in params),
            all_greedy=all(greedy),
            any_greedy=any(greedy),
        )

    def select(self, keep: torch.Tensor, keep_list: list[int]) -> RowSampling:
        """The rows still generating, after finished ones left the batch."""
        return RowSampling(
            temperature=self.temperature[keep],
            greedy=self.greedy[keep],
            top_k=self.top_k[keep],
            top_p=self.top_p[keep],
            min_p=self.min_p[keep],
            generators=[self.generators[i] for i in keep_list],
            needs_sort=self.needs_sort,
            needs_min_p=self.needs_min_p,
            scaled=self.scaled,
            all_greedy=bool(self.greedy[keep].all()),
            any_greedy=bool(self.greedy[keep].any()),
        )

    def place(self, slots: list[int], other: RowSampling) -> RowSampling:
        """`other`'s rows written over the rows at `slots` (finished rows whose places newcomers take)."""
        index = torch.tensor(slots, device=self.greedy.device)
        greedy = self.greedy.index_put((index,), other.greedy)
        generators = list(self.generators)
        for slot, generator in zip(slots, other.generators, strict=True):
            generators[slot] = generator
        return RowSampling(
            temperature=self.temperature.index_put((index,), other.temperature),
            greedy=greedy,
            top_k=self.top_k.index_put((index,), other.top_k),
            top_p=self.top_p.index_put((index,), other.top_p),
            min_p=self.min_p.index_put((index,), other.min_p),
            generators=generators,
            needs_sort=self.needs_sort or other.needs_sort,
            needs_min_p=self.needs_min_p or other.needs_min_p,
            scaled=self.scaled or other.scaled,
            all_greedy=bool(greedy.all()),
            any_greedy=bool(greedy.any()),
        )


def _row_seed(seed: int, sample_index: int) -> int:
    """Distinct, reproducible streams for the n samples of one seeded request."""
    return (seed * 1_000_003 + sample_index) % (2**63 - 1)


def filter_logits(scaled: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """Apply top-k, top-p and min-p per row to temperature-scaled logits ([B, V]); dropped tokens get -inf."""
    out = scaled
    if rows.needs_min_p:
        probs = torch.softmax(out, dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * rows.min_p.unsqueeze(-1)
        out = out.masked_fill(probs < threshold, float("-inf"))
    if rows.needs_sort:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        ranks = torch.arange(out.shape[-1], device=out.device).unsqueeze(0)
        drop = ranks >= rows.top_k.unsqueeze(-1)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop |= mass_before > rows.top_p.unsqueeze(-1)  # the top token always stays (mass_before = 0)
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
        seeded = [i for i, g in enumerate(rows.generators) if g is not None]
        if len(seeded) < logits.shape[0]:
            tokens = torch.multinomial(probs, 1).squeeze(-1)
        else:
            tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        for i in seeded:
            tokens[i] = torch.multinomial(probs[i], 1, generator=rows.generators[i]).squeeze(-1)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, scaled.argmax(dim=-1), tokens)
    if logp is None:
        return tokens, None
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
