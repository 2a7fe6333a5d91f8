"""`HFEngine`: the embedded rollout engine, a transformers causal LM sampled in-process.

It is the default because it needs nothing but the actor itself: pass the actor's `nn.Module` and the engine
samples from the very tensors being trained (no copy, no sync). Requests are grouped into batches of at most
`max_batch_rows` samples; multimodal requests run in their own batch, since their extra forward inputs (image
patches, 3-D rope positions) are per request. `agenerate` goes through a background batcher so concurrent
agent conversations share batches.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from rlloom.core_rl.generation import Completion, GenerationRequest
from rlloom.rollout.batching import AsyncBatcher
from rlloom.rollout.decoding import DecodeSettings, SampleRow, decode
from rlloom.rollout.prompts import render_prompt
from rlloom.rollout.stopping import StopStringWatcher, cut_at_stop, find_stop
from rlloom.rollout.weights import load_named_tensors


class HFEngineConfig(BaseModel):
    """Engine-wide settings of `HFEngine` (per-request knobs live in `SamplingParams`)."""

    model_config = ConfigDict(extra="forbid")

    max_batch_rows: int = Field(default=64, ge=1, description="Samples decoded together in one batch at most.")
    gather_s: float = Field(
        default=0.005, ge=0.0, description="How long `agenerate` waits for more callers before starting a batch."
    )
    compact_every: int = Field(
        default=1, ge=1, description="Drop finished rows from the batch once this many have piled up."
    )
    skip_special_tokens: bool = Field(default=True, description="Leave special tokens (EOS...) out of `text`.")


class HFEngine:
    """Samples a transformers causal LM in-process; implements core-rl's `RolloutEngine`."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, config: HFEngineConfig | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or HFEngineConfig()
        self._lock = threading.Lock()  # one batch on the model at a time (sync callers and the batcher)
        self.batches_run = 0  # decode batches so far (shows how well concurrent callers were batched)
        self._batcher = AsyncBatcher(self._run_batch, self.config.max_batch_rows, self.config.gather_s)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_token_ids), 0)
        model_config = getattr(model, "config", None)
        self._settings = DecodeSettings(
            pad_token_id=int(pad),
            max_positions=int(getattr(model_config, "max_position_embeddings", None) or 1 << 30),
            compact_every=self.config.compact_every,
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        config: HFEngineConfig | None = None,
    ) -> HFEngine:
        """Load a model folder; on CUDA defaults to bf16 and SDPA attention, on CPU to fp32."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
        torch.nn.Module.to(model, dev)
        model.eval()
        return cls(model, tokenizer, config)

    # -- prompts -------------------------------------------------------------------------------------------
    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The request's prompt as token ids, rendering chat messages with the tokenizer's chat template."""
        return render_prompt(self.tokenizer, request)

    # -- generation ----------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Complete every request (n samples each); the outer list follows `requests`."""
        results: list[list[Completion]] = [[] for _ in requests]

        def deliver(i: int, completions: list[Completion]) -> None:
            results[i] = completions

        self._run_batch(list(requests), deliver)
        return results

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Complete one request, batched with whatever other callers are waiting at the same time."""
        self._check_prompt(request, self.prompt_ids(request))  # a bad request fails its caller, not the batch
        return await self._batcher.submit(request)

    def close(self) -> None:
        """Stop the background batcher thread (safe to call twice)."""
        self._batcher.close()

    def _run_batch(self, requests: list[GenerationRequest], deliver: Any) -> None:
        """Validate, split into batches of at most `max_batch_rows` samples, decode, deliver per request."""
        prompts = [self.prompt_ids(r) for r in requests]
        for r, p in zip(requests, prompts, strict=True):
            self._check_prompt(r, p)
        text_only = [i for i, r in enumerate(requests) if not r.multimodal]
        groups: list[list[int]] = []
        current: list[int] = []
        rows_in_current = 0
        for i in text_only:
            n = requests[i].sampling.n
            if current and rows_in_current + n > self.config.max_batch_rows:
                groups.append(current)
                current, rows_in_current = [], 0
            current.append(i)
            rows_in_current += n
        if current:
            groups.append(current)
        groups.extend([i] for i, r in enumerate(requests) if r.multimodal)
        for group in groups:
            self._decode_group(requests, prompts, group, deliver)

    def _check_prompt(self, request: GenerationRequest, prompt: list[int]) -> None:
        if len(prompt) >= self._settings.max_positions:
            raise ValueError(
                f"request {request.request_id}: prompt has {len(prompt)} tokens but the model's context is "
                f"{self._settings.max_positions}; shorten `prompt_ids`/`messages`."
            )

    def _decode_group(
        self, requests: list[GenerationRequest], prompts: list[list[int]], group: list[int], deliver: Any
    ) -> None:
        rows = [self._make_row(i, s, prompts[i], requests[i]) for i in group for s in range(requests[i].sampling.n)]
        remaining = {i: requests[i].sampling.n for i in group}
        finished: dict[int, list[SampleRow]] = {i: [] for i in group}

        def on_finish(row: SampleRow) -> None:
            i = row.request_index
            finished[i].append(row)
            remaining[i] -= 1
            if remaining[i] == 0:
                rows_done = sorted(finished[i], key=lambda r: r.sample_index)
                deliver(i, [self._completion(requests[i], r) for r in rows_done])

        settings = self._settings
        mm = requests[group[0]].multimodal if len(group) == 1 else None
        if mm:
            settings = DecodeSettings(
                pad_token_id=settings.pad_token_id,
                max_positions=settings.max_positions,
                compact_every=1 << 30,  # the model keeps per-batch rope state; never reshape the batch
                forward_kwargs=dict(mm),
                explicit_positions=False,
            )
        with self._lock:
            self.batches_run += 1
            was_training = self.model.training  # a shared actor may be in train mode: no dropout while sampling
            self.model.eval()
            try:
                decode(self.model, rows, settings, on_finish)
            finally:
                self.model.train(was_training)

    def _make_row(self, i: int, s: int, prompt: list[int], request: GenerationRequest) -> SampleRow:
        params = request.sampling
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        watcher = (
            StopStringWatcher(self.tokenizer, params.stop, self.config.skip_special_tokens) if params.stop else None
        )
        return SampleRow(i, s, prompt, params, frozenset(stop_ids), watcher)

    def _completion(self, request: GenerationRequest, row: SampleRow) -> Completion:
        """Turn a finished row into a `Completion`; text is cut at a stop string, token ids never are."""
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=self.config.skip_special_tokens)
        stop_reason = row.stop_reason
        if row.finish_reason == "stop" and stop_reason is None and request.sampling.stop:
            match = find_stop(text, request.sampling.stop)
            if match is not None:
                text = cut_at_stop(text, match, request.sampling.include_stop_str_in_output)
                stop_reason = match.stop
        return Completion(
            request_id=request.request_id,
            prompt_ids=row.prompt_ids,
            token_ids=list(row.token_ids),
            text=text,
            finish_reason=row.finish_reason or "abort",
            logprobs=list(row.logprobs) if request.sampling.logprobs else None,
            stop_reason=stop_reason,
            sample_index=row.sample_index,
            timing={"ttft_s": row.first_token_s, "latency_s": row.done_s},
        )

    # -- weights -------------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy new weights into the model in place (skipped for tensors that already are the model's)."""
        with self._lock:
            load_named_tensors(self.model, named_tensors)


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (Qwen instruct lists two)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(int(e) for e in gen_eos)
    return ids
