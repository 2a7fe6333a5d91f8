"""The batched decode loop behind `HFEngine`, with continuous batching: one forward per new token, KV cached.

We run our own loop rather than `model.generate` because a rollout batch mixes per-request sampling
parameters, seeds, stop strings and token budgets, needs the sampled tokens' logprobs, and should hand each
request back the moment its samples finish (agents are waiting on them). Each unique prompt is prefilled once
and its cache rows repeated for the request's n samples; rows that finish are dropped from the batch (and the
KV cache). Between steps an optional `admit(room)` callback supplies new rows: they are prefilled on their own
cache and then joined to the running batch (vLLM/SGLang-style continuous batching), so requests that arrive
mid-decode never wait for the whole batch to end. One step of 64 rows costs far less than 64 steps of one row
(the tiny test model on one CPU thread: 3.1 ms against 0.85 ms for 4 rows), so this is what keeps an agent
workload (conversations coming back from tools at random times) batched.
Left padding plus explicit position ids keep padded and joined rows numerically equal to unpadded ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import DynamicCache

from rlloom.core_rl.contracts.generation import FinishReason, SamplingParams
from rlloom.rollout.hf.kv_cache import (
    cache_keyword,
    dynamic_layers,
    merge_caches,
    mergeable,
    trim_left_cache,
    write_rows,
)
from rlloom.rollout.hf.pause import PauseGate
from rlloom.rollout.hf.prefix_cache import PrefixCache, PrefixHit
from rlloom.rollout.hf.reprefill import prefill_sequences
from rlloom.rollout.hf.sampling import RowSampling, sample_next
from rlloom.rollout.hf.stopping import StopStringWatcher


@dataclass(slots=True)
class SampleRow:
    """One sample being generated: its prompt, knobs, and what has been sampled so far."""

    request_index: int
    sample_index: int
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    watcher: StopStringWatcher | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)  # the policy version that sampled each token
    kv_stale: bool = False  # its keys/values span a weight update, kept (never stored in the prefix cache)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    joined_at: float = 0.0  # perf_counter() when its prefill started; timings below are relative to it
    first_token_s: float = 0.0
    done_s: float = 0.0


@dataclass(slots=True)
class DecodeSettings:
    """Engine-wide knobs of the loop (not per request)."""

    pad_token_id: int
    max_positions: int  # the model's context length; a row that reaches it ends with 'length'
    compact_every: int = 1  # drop finished rows once at least this many have piled up
    forward_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. multimodal tensors for the prefill
    explicit_positions: bool = True  # False lets the model build positions (Qwen2-VL's 3-D rope); no admission
    # (3, L) M-RoPE positions of the one prompt being decoded (Qwen2-VL); generated tokens continue after the
    # largest, on all three rows, so engine and actor (teacher-forced with the same positions) agree
    rope_positions: torch.Tensor | None = None
    banned_token_ids: tuple[int, ...] = ()  # never sampled (e.g. <|image_pad|>); logprobs stay full-vocabulary
    max_rows: int = 1 << 30  # admission never grows the batch beyond this many unfinished rows
    admit_every: int = 1  # poll `admit` every this many decode steps
    prefix_cache: PrefixCache | None = None  # reuse finished rows' keys/values for prompts extending them
    # after an in-flight weight update: keep the rows' old-weight keys/values, or recompute them (reprefill.py)
    inflight_kv: Literal["keep", "reprefill"] = "keep"


@dataclass(slots=True)
class DecodeStats:
    """What `decode` calls did (for engine metrics and tests of the row budget); may accumulate over calls."""

    steps: int = 0  # forwards of the running batch after prefill
    peak_rows: int = 0  # largest number of rows in one forward
    joins: int = 0  # prefilled groups merged into a running batch
    prefill_tokens: int = 0  # prompt tokens run through the model (once per distinct request)
    reused_tokens: int = 0  # prompt tokens whose keys/values came from the prefix cache instead
    filled_in_place: int = 0  # joins written into finished rows' places (no rewrite of the whole cache)
    reprefilled_tokens: int = 0  # prompt + generated tokens run again under new weights after in-flight updates


AdmitRows = Callable[[int], list[SampleRow]]
"""`admit(room)`: rows (at most `room`) to join the batch now; [] when nothing waits."""
AdmitFailed = Callable[[list[SampleRow], BaseException], None]
"""Told which admitted rows could not be prefilled (their callers fail; the running batch goes on)."""


def left_pad(prompts: Sequence[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask, padded on the left so every prompt ends at the last column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _row_finish(row: SampleRow, token: int, settings: DecodeSettings) -> None:
    """Decide whether `token` (just appended) ends the row, and why."""
    if token in row.stop_ids:
        row.finish_reason, row.stop_reason = "stop", token
    elif row.watcher is not None and row.watcher.push(token):
        row.finish_reason = "stop"
    elif len(row.token_ids) >= min(row.params.max_tokens, settings.max_positions - len(row.prompt_ids)):
        row.finish_reason = "length"


class RunningBatch:
    """Rows decoding together and their tensors, aligned row for row; `logits` await the next sample."""

    def __init__(
        self,
        *,
        rows: list[SampleRow],
        cache: DynamicCache,
        mask: torch.Tensor,
        last_pos: torch.Tensor,
        sampling: RowSampling,
        logits: torch.Tensor,
    ) -> None:
        self.rows, self.cache, self.mask, self.last_pos = rows, cache, mask, last_pos
        self.sampling, self.logits = sampling, logits
        self.want_logprobs = any(r.params.logprobs for r in rows)
        self.tokens: torch.Tensor | None = None  # sampled, not yet fed to the model
        self.just_finished: list[int] = []  # rows the last `sample` finished

    @classmethod
    def prefill(
        cls, model: torch.nn.Module, rows: list[SampleRow], settings: DecodeSettings, stats: DecodeStats | None = None
    ) -> RunningBatch:
        """Run the prompts of `rows` through the model once per distinct request and expand to one row per sample.

        With a prefix cache, a prompt that extends a stored sequence starts from its keys/values and only its
        new tail is run. The columns are then [padding | cached prefix | padding | new tail]; the attention mask
        is 0 on both paddings and the explicit position ids continue the prefix, so a row's numbers are those
        of a plain prefill.
        """
        device = next(model.parameters()).device
        now = time.perf_counter()
        for r in rows:
            r.joined_at = now
        request_order = list(dict.fromkeys(r.request_index for r in rows))
        first_row = {r.request_index: r for r in reversed(rows)}
        prompts = [first_row[q].prompt_ids for q in request_order]
        hits = _lookup_prefixes(prompts, settings)
        cache = DynamicCache(config=getattr(model, "config", None))
        past_mask = _fill_cache_from_hits(cache, hits, device) if hits is not None else None
        reused = [h.length if h is not None else 0 for h in hits] if hits is not None else [0] * len(prompts)
        ids, mask = left_pad([p[n:] for p, n in zip(prompts, reused, strict=True)], settings.pad_token_id, device)
        if past_mask is not None:
            mask = torch.cat([past_mask, mask], dim=-1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kwargs: dict[str, Any] = dict(settings.forward_kwargs)
        last_pos = positions[:, -1:]
        if settings.rope_positions is not None:
            kwargs["position_ids"], last_pos = _rope_prefill_positions(settings.rope_positions, ids, reused)
        elif settings.explicit_positions:
            kwargs["position_ids"] = positions[:, -ids.shape[1] :]
        kwargs[cache_keyword(model)] = cache
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **kwargs)
        if stats is not None:
            stats.reused_tokens += sum(reused)
            stats.prefill_tokens += sum(len(p) for p in prompts) - sum(reused)
        logits = out.logits[:, -1, :]
        slot = {q: i for i, q in enumerate(request_order)}
        expand = torch.tensor([slot[r.request_index] for r in rows], device=device)
        if len(rows) != len(request_order):
            cache.batch_select_indices(expand)
            logits, mask, last_pos = logits[expand], mask[expand], last_pos[expand]
        sampling = RowSampling.build([r.params for r in rows], [r.sample_index for r in rows], logits.shape[-1], device)
        return cls(rows=list(rows), cache=cache, mask=mask, last_pos=last_pos, sampling=sampling, logits=logits)

    def store_finished(self, cache_store: PrefixCache, finished: list[int]) -> None:
        """Give the prefix cache the keys/values of the rows at `finished` (every token that went through the model)."""
        if not finished or not mergeable(self.cache):
            return
        for j in finished:
            row = self.rows[j]
            if row.kv_stale:
                continue
            fed = row.prompt_ids + row.token_ids[:-1]  # the last sampled token was never fed
            columns = self.mask[j].nonzero().squeeze(-1)
            if columns.numel() != len(fed):  # cannot happen with left padding; never store misaligned keys
                continue
            layers = []
            for layer in dynamic_layers(self.cache):
                assert layer.keys is not None and layer.values is not None
                layers.append((layer.keys[j].index_select(-2, columns), layer.values[j].index_select(-2, columns)))
            cache_store.insert(fed, layers)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def unfinished(self) -> int:
        return sum(r.finish_reason is None for r in self.rows)

    def sample(self, settings: DecodeSettings, on_finish: Callable[[SampleRow], None] | None, version: int = 0) -> int:
        """Sample one token for every row (labelled policy `version`); returns how many rows are finished."""
        if settings.banned_token_ids:
            tokens, logprobs = _sample_without(
                self.logits, self.sampling, self.want_logprobs, settings.banned_token_ids
            )
        else:
            tokens, logprobs = sample_next(self.logits, self.sampling, self.want_logprobs)
        self.tokens = tokens
        token_list = tokens.tolist()
        logprob_list = logprobs.tolist() if logprobs is not None else None
        now = time.perf_counter()
        finished = 0
        self.just_finished = []
        for j, row in enumerate(self.rows):
            if row.finish_reason is not None:
                finished += 1
                continue
            row.token_ids.append(token_list[j])
            row.policy_versions.append(version)
            if logprob_list is not None and row.params.logprobs:
                row.logprobs.append(logprob_list[j])
            if len(row.token_ids) == 1:
                row.first_token_s = now - row.joined_at
            _row_finish(row, token_list[j], settings)
            if row.finish_reason is not None:
                finished += 1
                self.just_finished.append(j)
                row.done_s = now - row.joined_at
                if on_finish is not None:
                    on_finish(row)
        return finished

    def abandon(self, abandoned: Callable[[SampleRow], bool]) -> None:
        """End the unfinished rows nobody waits for any more (a cancelled caller) with 'abort', freeing their places."""
        now = time.perf_counter()
        for row in self.rows:
            if row.finish_reason is None and abandoned(row):
                row.finish_reason = "abort"
                row.done_s = now - row.joined_at

    def compact(self) -> None:
        """Drop finished rows, then the left columns that have become padding for every row left."""
        keep_list = [j for j, r in enumerate(self.rows) if r.finish_reason is None]
        if len(keep_list) == len(self.rows):
            return
        keep = torch.tensor(keep_list, device=self.mask.device)
        self.cache.batch_select_indices(keep)
        self.mask, self.last_pos, self.logits = self.mask[keep], self.last_pos[keep], self.logits[keep]
        if self.tokens is not None:
            self.tokens = self.tokens[keep]
        self.sampling = self.sampling.select(keep)
        self.rows = [self.rows[j] for j in keep_list]
        self.trim_left()

    def trim_left(self) -> None:
        """Drop the left columns that are padding for every row (views, no copy)."""
        if self.rows and mergeable(self.cache):
            first = _first_used_column(self.mask)
            if 0 < first < self.mask.shape[1]:
                trim_left_cache(self.cache, first)
                self.mask = self.mask[:, first:]

    def reprefill(self, model: torch.nn.Module, settings: DecodeSettings, stats: DecodeStats) -> None:
        """Recompute the rows' keys/values under the model's current weights (after an in-flight update).

        Finished rows are dropped first. Each row's prompt and the tokens fed so far run through the model again;
        the last sampled token (`tokens`) is fed by the next `advance` as usual. Sampling state (seeded streams'
        counters), logprobs and versions are the rows' own and stay as they are.
        """
        self.compact()
        fed = [row.prompt_ids + row.token_ids[:-1] for row in self.rows]
        fresh = prefill_sequences(model, fed, settings.pad_token_id)
        self.cache, self.mask, self.last_pos = fresh.cache, fresh.mask, fresh.last_pos
        stats.reprefilled_tokens += sum(len(f) for f in fed)

    def advance(self, model: torch.nn.Module, settings: DecodeSettings) -> None:
        """Feed the sampled tokens through the model; `logits` become the next step's."""
        assert self.tokens is not None, "sample() before advance()"
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=-1)
        self.last_pos = self.last_pos + 1
        step_kwargs: dict[str, Any] = {"position_ids": self.last_pos} if settings.explicit_positions else {}
        step_kwargs[cache_keyword(model)] = self.cache
        out = model(input_ids=self.tokens.unsqueeze(-1), attention_mask=self.mask, use_cache=True, **step_kwargs)
        self.logits = out.logits[:, -1, :]
        self.tokens = None

    def fill_finished(self, other: RunningBatch) -> bool:
        """Write `other`'s rows into the places of finished rows, in place; False (nothing done) if they don't fit.

        They fit when there are at least as many finished rows as newcomers and the newcomers' columns are no
        wider than the batch's. Then only the newcomers' keys/values are written, whatever the batch's size: at
        an agent's turn boundary (one row finishes, a waiting conversation takes its place) this replaces a
        rewrite of the whole cache.
        """
        width, their_width = self.mask.shape[1], other.mask.shape[1]
        finished = [j for j, r in enumerate(self.rows) if r.finish_reason is not None]
        if len(finished) < other.size or their_width > width or self.tokens is not None:
            return False
        slots = finished[: other.size]
        pad = width - their_width
        write_rows(self.cache, slots, other.cache)
        index = torch.tensor(slots, device=self.mask.device)
        self.mask[index] = torch.cat([other.mask.new_zeros((other.size, pad)), other.mask], dim=-1)
        self.last_pos[index] = other.last_pos
        self.logits[index] = other.logits
        self.sampling = self.sampling.place(slots, other.sampling)
        for slot, row in zip(slots, other.rows, strict=True):
            self.rows[slot] = row
        self.want_logprobs = self.want_logprobs or other.want_logprobs
        self.trim_left()
        return True

    def absorb(self, other: RunningBatch) -> None:
        """Drop finished rows and append `other`'s rows (both awaiting a sample) in one write per cache layer.

        Continuous batching does this at every turn of an agent workload (a row finishes, a waiting one joins);
        compacting, padding and concatenating separately copied the whole cache two or three times.
        """
        keep_list = [j for j, r in enumerate(self.rows) if r.finish_reason is None]
        dropped = len(keep_list) != len(self.rows)
        keep = torch.tensor(keep_list, device=self.mask.device) if dropped else None
        mask = self.mask if keep is None else self.mask[keep]
        first = _first_used_column(mask)
        merge_caches(self.cache, keep, first, other.cache)
        mine_width, their_width = mask.shape[1] - first, other.mask.shape[1]
        width = max(mine_width, their_width)
        self.mask = torch.cat(
            [
                torch.cat([mask.new_zeros((len(keep_list), width - mine_width)), mask[:, first:]], dim=-1),
                torch.cat([other.mask.new_zeros((other.size, width - their_width)), other.mask], dim=-1),
            ]
        )
        if keep is not None:
            self.last_pos, self.logits = self.last_pos[keep], self.logits[keep]
            if self.tokens is not None:
                self.tokens = self.tokens[keep]
            self.sampling = self.sampling.select(keep)
            self.rows = [self.rows[j] for j in keep_list]
        self.last_pos = torch.cat([self.last_pos, other.last_pos])
        self.logits = torch.cat([self.logits, other.logits])
        self.sampling = self.sampling.joined(other.sampling)
        self.rows = [*self.rows, *other.rows]
        self.want_logprobs = self.want_logprobs or other.want_logprobs


@torch.inference_mode()
def decode(
    model: torch.nn.Module,
    rows: list[SampleRow],
    settings: DecodeSettings,
    on_finish: Callable[[SampleRow], None] | None = None,
    *,
    admit: AdmitRows | None = None,
    on_admit_error: AdmitFailed | None = None,
    stats: DecodeStats | None = None,
    abandoned: Callable[[SampleRow], bool] | None = None,
    gate: PauseGate | None = None,
) -> DecodeStats:
    """Generate rows to completion, filling `token_ids`, `logprobs` and `finish_reason`.

    Without `admit`, `rows` are decoded as one batch. With it, `admit(room)` is polled between steps and the
    rows it returns join the running batch, until the batch is empty and nothing more is admitted. `stats`
    (a fresh one when None) is updated as the loop runs, so an engine can accumulate and read it live.
    `abandoned(row)`, asked of every unfinished row before each step, ends the rows whose caller has gone
    (finish 'abort', no `on_finish`), so a cancelled request stops taking a place others wait for.
    With a `gate`, every token is labelled its `version`, and the loop parks at `gate.checkpoint()` between
    sampling a token and feeding it, so an in-flight weight update lands at a token boundary (see `PauseGate`);
    the rows then keep their keys/values or are re-prefilled, as `settings.inflight_kv` says.
    """
    stats = stats if stats is not None else DecodeStats()
    if gate is not None and settings.inflight_kv == "reprefill" and _multimodal(settings):
        raise ValueError(
            "inflight_kv='reprefill' cannot re-prefill a multimodal decode (its image inputs and M-RoPE positions "
            "cover the prompt alone); use HFEngineConfig(inflight_kv='keep') for multimodal requests"
        )
    batch = RunningBatch.prefill(model, rows, settings, stats) if rows else None
    can_admit = admit is not None and settings.explicit_positions and (batch is None or mergeable(batch.cache))
    while True:
        if abandoned is not None and batch is not None:
            batch.abandon(abandoned)
            if batch.unfinished == 0:  # nobody waits for any row: start afresh (no empty compact or join)
                batch = None
        if admit is not None and can_admit and (batch is None or stats.steps % settings.admit_every == 0):
            batch = _admit(
                model, batch=batch, settings=settings, admit=admit, on_admit_error=on_admit_error, stats=stats
            )
            can_admit = batch is None or mergeable(batch.cache)
        if batch is None:
            return stats
        stats.peak_rows = max(stats.peak_rows, batch.size)
        finished = batch.sample(settings, on_finish, gate.version if gate is not None else 0)
        if settings.prefix_cache is not None:
            batch.store_finished(settings.prefix_cache, batch.just_finished)
        if finished == batch.size:
            batch = None
            if admit is None or not can_admit:
                return stats
            continue
        admit_next = can_admit and (stats.steps + 1) % settings.admit_every == 0
        if finished >= settings.compact_every and not (admit_next and finished < batch.size):
            batch.compact()  # (when an admission comes next step, `absorb` drops them while joining)
        if gate is not None and gate.checkpoint():
            _weights_changed(model, batch, settings, stats)
        batch.advance(model, settings)
        stats.steps += 1


def _admit(
    model: torch.nn.Module,
    *,
    batch: RunningBatch | None,
    settings: DecodeSettings,
    admit: AdmitRows,
    on_admit_error: AdmitFailed | None,
    stats: DecodeStats,
) -> RunningBatch | None:
    """Prefill whatever `admit` hands over (within the row budget) and join it to `batch`."""
    room = settings.max_rows - (batch.unfinished if batch is not None else 0)
    new_rows = admit(room) if room > 0 else []
    if len(new_rows) > room:
        raise RuntimeError(f"admit({room}) returned {len(new_rows)} rows; it must respect the row budget")
    joined = _prefill_isolated(model, new_rows, settings, on_admit_error, stats) if new_rows else None
    if batch is None:
        return joined
    if joined is not None:
        if batch.fill_finished(joined):
            stats.filled_in_place += 1
        else:
            batch.absorb(joined)
        stats.joins += 1
    if batch.size - batch.unfinished >= settings.compact_every:
        batch.compact()  # finished rows whose compaction was left to this admission and no newcomer replaced
    return batch


def _weights_changed(model: torch.nn.Module, batch: RunningBatch, settings: DecodeSettings, stats: DecodeStats) -> None:
    """After an in-flight update the prefix cache's content is the old weights', so it may not seed a later
    prompt; the running rows' keys/values are recomputed ('reprefill') or kept and marked stale ('keep')."""
    if settings.prefix_cache is not None:
        settings.prefix_cache.clear()
    if settings.inflight_kv == "reprefill":
        batch.reprefill(model, settings, stats)
        return
    for row in batch.rows:
        row.kv_stale = True


def _multimodal(settings: DecodeSettings) -> bool:
    """Whether the decode runs with per-prompt extra inputs or positions (a vision-language prompt)."""
    return bool(settings.forward_kwargs) or settings.rope_positions is not None or not settings.explicit_positions


def _prefill_isolated(
    model: torch.nn.Module,
    rows: list[SampleRow],
    settings: DecodeSettings,
    on_admit_error: AdmitFailed | None,
    stats: DecodeStats,
) -> RunningBatch | None:
    """Prefill `rows`; if that raises, retry request by request so only the culprit's callers fail."""
    try:
        return RunningBatch.prefill(model, rows, settings, stats)
    except Exception as exc:
        if on_admit_error is None:
            raise
        groups: dict[int, list[SampleRow]] = {}
        for r in rows:
            groups.setdefault(r.request_index, []).append(r)
        if len(groups) == 1:
            on_admit_error(rows, exc)
            return None
    out: RunningBatch | None = None
    for group in groups.values():
        try:
            part = RunningBatch.prefill(model, group, settings, stats)
        except Exception as exc:
            on_admit_error(group, exc)
            continue
        if out is None:
            out = part
        else:
            out.absorb(part)
    return out


def _rope_prefill_positions(
    rope_positions: torch.Tensor, ids: torch.Tensor, reused: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill position ids (3, 1, L) from a prompt's M-RoPE positions, and the last position to continue from.

    The next token's position is one past the largest so far (an image's rows can outrun the text row), which is
    where transformers' `rope_deltas` puts it; decode steps pass last + 1 as 2-D ids that the model repeats on
    all three rows.
    """
    if rope_positions.shape[0] == 4:  # transformers' packed layout: a text row, then the three M-RoPE rows
        rope_positions = rope_positions[1:]
    positions = rope_positions.reshape(3, -1).to(ids.device)  # (3, L) or (3, 1, L) in
    if ids.shape[0] != 1 or any(reused) or positions.shape[-1] != ids.shape[1]:
        raise ValueError(
            f"M-RoPE positions cover {positions.shape[-1]} tokens but the prefill is {tuple(ids.shape)}: "
            "give one prompt's (3, len(prompt_ids)) positions, one request per decode"
        )
    last = positions.max().reshape(1, 1)
    return positions.unsqueeze(1), last


def _sample_without(
    logits: torch.Tensor, rows: RowSampling, want_logprobs: bool, banned: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample with `banned` tokens at -inf, but return the full-vocabulary logprobs the trainer recomputes.

    A ban is a truncation of the distribution like top-k, and like top-k it leaves the reported logprob
    (`log_softmax(logits / temperature)`) alone, so rollout and actor logprobs still agree.
    """
    index = torch.tensor(banned, device=logits.device)
    tokens, _ = sample_next(logits.index_fill(-1, index, float("-inf")), rows, want_logprobs=False)
    if not want_logprobs:
        return tokens, None
    scaled = logits.float() / rows.temperature if rows.scaled else logits.float()
    return tokens, torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _first_used_column(mask: torch.Tensor) -> int:
    """The first column some row attends to (the mask's width when none does): all before it is padding."""
    used = mask.any(dim=0)
    return int(used.to(torch.int8).argmax()) if bool(used.any()) else mask.shape[1]


def _lookup_prefixes(prompts: list[list[int]], settings: DecodeSettings) -> list[PrefixHit | None] | None:
    """Each prompt's longest cached prefix, or None when there is no cache or no prompt has one."""
    if settings.prefix_cache is None or settings.forward_kwargs or not settings.explicit_positions:
        return None
    hits = [settings.prefix_cache.lookup(p) for p in prompts]
    return hits if any(h is not None for h in hits) else None


def _fill_cache_from_hits(cache: DynamicCache, hits: list[PrefixHit | None], device: torch.device) -> torch.Tensor:
    """Load the hits' keys/values into `cache`, right-aligned per row; returns their attention mask."""
    width = max(h.length for h in hits if h is not None)
    template = next(h for h in hits if h is not None)
    mask = torch.zeros((len(hits), width), dtype=torch.long, device=device)
    for layer_index, (keys0, values0) in enumerate(template.layers):
        keys = keys0.new_zeros((len(hits), keys0.shape[0], width, keys0.shape[-1]))
        values = values0.new_zeros((len(hits), values0.shape[0], width, values0.shape[-1]))
        for i, hit in enumerate(hits):
            if hit is not None:
                k, v = hit.layers[layer_index]
                keys[i, :, width - hit.length :] = k
                values[i, :, width - hit.length :] = v
        cache.update(keys, values, layer_index)
    for i, hit in enumerate(hits):
        if hit is not None:
            mask[i, width - hit.length :] = 1
    return mask
