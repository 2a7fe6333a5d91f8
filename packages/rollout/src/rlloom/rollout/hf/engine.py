"""`HFEngine`: the embedded rollout engine, a transformers causal LM sampled in-process.

It is the default because it needs nothing but the actor itself: pass the actor's `nn.Module` and the engine
samples from the very tensors being trained (no copy, no sync). Requests are grouped into batches of at most
`max_batch_rows` samples that is refilled as rows finish (continuous batching): `agenerate` callers join the
running decode at the next step, so concurrent agent conversations share one batch however they arrive.
Multimodal requests run in their own batch, since their extra forward inputs (image patches, 3-D rope
positions) are per request.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, NoReturn

import torch
from pydantic import BaseModel, ConfigDict, Field

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.observe import progress
from rlloom.rollout.batching import ContinuousBatcher, TakeTickets, Ticket
from rlloom.rollout.hf.decoding import DecodeSettings, DecodeStats, SampleRow, decode
from rlloom.rollout.hf.pause import PauseGate
from rlloom.rollout.hf.prefix_cache import PrefixCache
from rlloom.rollout.hf.stopping import StopStringWatcher, TokenPieces, cut_at_stop, find_stop
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
    admit_every: int = Field(
        default=1,
        ge=1,
        description="Let waiting requests join the running batch every this many decode steps (1: every step).",
    )
    skip_special_tokens: bool = Field(default=True, description="Leave special tokens (EOS...) out of `text`.")
    prefix_cache_tokens: int = Field(
        default=0,
        ge=0,
        description="Keep finished sequences' keys/values, up to this many tokens in all, so a prompt that extends "
        "one (an agent's next turn) prefills only its new tokens. 0 turns prefix caching off.",
    )
    inflight_kv: Literal["keep", "reprefill"] = Field(
        default="keep",
        description="Requests paused by an in-flight weight update (pause_generation / resume_generation). keep: "
        "they feed on with the keys/values the old weights computed (no recompute; AReaL's practice; tokens "
        "after the push read old-weight keys/values). reprefill: at the resume each one's prompt + tokens so far "
        "is prefilled again under the new weights, so every later token is exactly the new policy's (one prefill "
        "per request per push). Text models only: a vision-language model is refused with reprefill.",
    )


class HFEngine:
    """Samples a transformers causal LM in-process; implements core-rl's `RolloutEngine` and the capabilities
    `InflightWeightUpdate` (keys/values kept or re-prefilled: `inflight_kv`), `HasContextWindow`, `HasEosTokens`,
    `HasTokenizer` and `Closable` (its batcher thread). Every completion's tokens carry the policy version they
    were sampled under (0 until the first `resume_generation`)."""

    tokenizer: Any
    eos_token_ids: set[int]  # the tokenizer's and the model's generation config's
    context_window: int | None  # the model's max_position_embeddings, when it has one

    def __init__(self, model: torch.nn.Module, tokenizer: Any, config: HFEngineConfig | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or HFEngineConfig()
        model_config = getattr(model, "config", None)
        self._vision_token_ids = _vision_token_ids(model_config)
        if self.config.inflight_kv == "reprefill" and self._vision_token_ids:
            raise ValueError(
                f"HFEngineConfig.inflight_kv='reprefill' is not supported for {type(model).__name__}, a vision-"
                "language model: its multimodal decodes carry image inputs and M-RoPE positions for the prompt "
                "alone, which a re-prefill would have to rebuild; use inflight_kv='keep'"
            )
        self._lock = threading.Lock()  # one batch on the model at a time (sync callers and the batcher)
        self._gate = PauseGate()  # in-flight weight updates: decodes park at a token boundary while paused
        self.batches_run = 0  # decode runs so far (a continuous run may serve many waves of callers)
        self.decode_stats = DecodeStats()  # peak rows per forward, joins into running batches, steps (live)
        self._batcher = ContinuousBatcher(self._serve, self.config.max_batch_rows, self.config.gather_s)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_token_ids), 0)
        self.prefix_cache = PrefixCache(self.config.prefix_cache_tokens) if self.config.prefix_cache_tokens else None
        self._weights_version = self._parameter_versions()
        self._loads = 0  # update_weights calls (they write through .data, which the parameters' counters miss)
        self._weights_at_pause = self._weights_fingerprint()
        positions = getattr(model_config, "max_position_embeddings", None)
        self.context_window = int(positions) if positions else None
        """Prompt + completion tokens the model takes (its max_position_embeddings); None when it names none."""
        self._settings = DecodeSettings(
            pad_token_id=int(pad),
            max_positions=self.context_window or 1 << 30,
            compact_every=self.config.compact_every,
            max_rows=self.config.max_batch_rows,
            admit_every=self.config.admit_every,
            prefix_cache=self.prefix_cache,
            inflight_kv=self.config.inflight_kv,
        )
        self._vocab_size = int(getattr(model_config, "vocab_size", None) or len(tokenizer))
        self._token_pieces = TokenPieces(tokenizer)  # lets stop-string watchers skip most tokens

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        tokenizer_path: str | Path | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        config: HFEngineConfig | None = None,
    ) -> HFEngine:
        """Load a model folder (its tokenizer from `tokenizer_path` when saved apart, as the trainer's
        `model.tokenizer_path`); on CUDA defaults to bf16 and SDPA attention, on CPU to fp32."""
        from rlloom.core_rl.workers.actor import model_class
        from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        tokenizer = load_pretrained_tokenizer(tokenizer_path or path)
        tokenizer.padding_side = "left"
        # a vision-language checkpoint (Qwen2.5-VL) loads as its image-text-to-text class
        model = model_class(str(path)).from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
        torch.nn.Module.to(model, dev)
        model.eval()
        return cls(model, tokenizer, config)

    # -- prompts -------------------------------------------------------------------------------------------
    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The request's prompt as token ids, rendering chat messages with the tokenizer's chat template."""
        return render_prompt(self.tokenizer, request)

    # -- generation ----------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Complete every request (n samples each); the outer list follows `requests`.

        Text requests share one continuously refilled batch of at most `max_batch_rows` rows: as rows finish,
        waiting ones join, so a long straggler never holds back the rest. Each finished request's samples and
        tokens go to core-rl's progress line (`[rollout] 24/64 samples, 3,072 tokens ...` every few seconds).
        """
        results: list[list[Completion]] = [[] for _ in requests]
        samples = sum(r.sampling.n for r in requests)

        def deliver_to(i: int) -> Callable[[list[Completion]], None]:
            def deliver(completions: list[Completion]) -> None:
                results[i] = completions
                progress.advance(len(completions), tokens=_tokens(completions), total=samples, unit="samples")

            return deliver

        feed = _RowFeed(self)
        for request in requests:  # validate everything before decoding anything
            self._check_prompt(request, self.prompt_ids(request))
        for i, request in enumerate(requests):
            if not request.multimodal:
                feed.add(request, deliver_to(i), _reraise)
        self._decode_continuous(feed)
        for i, request in enumerate(requests):
            if request.multimodal:
                self._decode_alone(request, deliver_to(i))
        return results

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Complete one request; it joins the running batch at the next step (continuous batching). Reported to
        core-rl's progress line as one turn with its tokens, as vLLM's async engine does."""
        self._check_prompt(request, self.prompt_ids(request))  # a bad request fails its caller, not the batch
        completions = await self._batcher.submit(request)
        progress.advance(1, tokens=_tokens(completions), unit="turns")  # a line every 5 s at most
        return completions

    def close(self) -> None:
        """Stop the background batcher thread (safe to call twice); a paused engine is resumed first, so the
        thread is not left parked."""
        if self._gate.paused:
            self._gate.resume(self._gate.version)
        self._batcher.close()

    def _serve(self, take: TakeTickets) -> None:
        """One run of the batcher's worker: multimodal tickets alone, text tickets in a continuous batch."""
        tickets = take(self.config.max_batch_rows)
        for ticket in tickets:
            if ticket.request.multimodal and not ticket.cancelled:  # a caller that gave up is not decoded
                try:
                    self._decode_alone(ticket.request, ticket.deliver, _cancel_check(ticket))
                except Exception as exc:  # its own batch: only this caller fails
                    ticket.fail(exc)
        feed = _RowFeed(self, lambda room: take(room, _is_text))
        for ticket in tickets:
            if not ticket.request.multimodal:
                feed.add_ticket(ticket)
        self._decode_continuous(feed)

    def _check_prompt(self, request: GenerationRequest, prompt: list[int]) -> None:
        if len(prompt) >= self._settings.max_positions:
            raise ValueError(
                f"request {request.request_id}: prompt has {len(prompt)} tokens but the model's context is "
                f"{self._settings.max_positions}; shorten `prompt_ids`/`messages`."
            )
        bad = next((t for t in prompt if not 0 <= t < self._vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"request {request.request_id}: prompt_ids holds token id {bad}, outside the model's vocabulary "
                f"(0..{self._vocab_size - 1}); encode the prompt with this engine's tokenizer."
            )

    def _decode_continuous(self, feed: _RowFeed) -> None:
        """Decode everything `feed` holds or admits later, joining new rows into the running batch."""
        if not feed.backlog:  # nothing to start with; later arrivals start the worker's next run
            return
        with self._sampling_mode(), self._gate.decoding():
            self.batches_run += 1
            decode(
                self.model,
                [],
                self._settings,
                feed.on_finish,
                admit=feed,
                on_admit_error=feed.on_error,
                stats=self.decode_stats,
                abandoned=feed.abandoned,
                gate=self._gate,
            )

    def _decode_alone(
        self,
        request: GenerationRequest,
        deliver: Callable[[list[Completion]], None],
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """A multimodal request in its own batch: its image inputs and 3-D rope positions are per request.

        With `position_ids` in `request.multimodal` (the prompt's (3, L) M-RoPE positions, as
        `rlloom.multimodal.VisionInputs.engine_inputs()` gives them) every forward gets explicit positions: the
        prompt's for the prefill, one past the largest for each new token, exactly what the actor's
        teacher-forced forward uses. Without them the model infers positions itself (stateful `rope_deltas`;
        Qwen2.5-VL in transformers 5.x falls back to 1-D positions unless also given `mm_token_type_ids`).
        The model's vision tokens (image/video pads, vision start) are never sampled. Once `cancelled()` is true
        (its `agenerate` caller gave up) the rows end 'abort' at the next step.
        """
        prompt = self.prompt_ids(request)
        self._check_prompt(request, prompt)
        rows = [self._make_row(0, s, prompt, request) for s in range(request.sampling.n)]
        forward_kwargs = dict(request.multimodal or {})
        rope_positions = forward_kwargs.pop("position_ids", None)
        settings = replace(
            self._settings,
            compact_every=1 << 30,  # the model may keep per-batch rope state; never reshape the batch
            forward_kwargs=forward_kwargs,
            explicit_positions=rope_positions is not None,
            rope_positions=rope_positions,
            banned_token_ids=self._vision_token_ids,
            prefix_cache=None,
        )
        with self._sampling_mode(), self._gate.decoding():
            self.batches_run += 1
            abandoned = (lambda _row: cancelled()) if cancelled is not None else None
            decode(self.model, rows, settings, stats=self.decode_stats, abandoned=abandoned, gate=self._gate)
        deliver([self._completion(request, r) for r in rows])

    @contextmanager
    def _sampling_mode(self) -> Iterator[None]:
        """Hold the model (one decode at a time) in eval mode; a shared actor may be in train mode."""
        with self._lock:
            honour_thread_setting()  # the batcher's worker or a caller's thread pool
            was_training = self.model.training
            self.model.eval()
            self._drop_stale_prefixes()
            try:
                yield
            finally:
                self.model.train(was_training)

    def _parameter_versions(self) -> int:
        """Sum of the parameters' in-place write counters: it moves whenever an optimizer step changes them."""
        return sum(p._version for p in self.model.parameters())

    def _weights_fingerprint(self) -> tuple[int, int]:
        """What moves when the weights change: loads through `update_weights`, and in-place optimizer steps."""
        return self._loads, self._parameter_versions()

    def _drop_stale_prefixes(self) -> None:
        """Clear the prefix cache if the weights changed since it was filled (a shared actor trains in place)."""
        if self.prefix_cache is None:
            return
        version = self._parameter_versions()
        if version != self._weights_version:
            self.prefix_cache.clear()
        self._weights_version = version

    @property
    def peak_batch_rows(self) -> int:
        """Most rows in one forward so far (never above `max_batch_rows`)."""
        return self.decode_stats.peak_rows

    @property
    def joins(self) -> int:
        """Times newly arrived requests joined a running batch."""
        return self.decode_stats.joins

    def _make_row(self, i: int, s: int, prompt: list[int], request: GenerationRequest) -> SampleRow:
        params = request.sampling
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        watcher = (
            StopStringWatcher(self.tokenizer, params.stop, self.config.skip_special_tokens, self._token_pieces)
            if params.stop
            else None
        )
        return SampleRow(i, s, prompt, params, frozenset(stop_ids), watcher)

    def _completion(self, request: GenerationRequest, row: SampleRow) -> Completion:
        """Turn a finished row into a `Completion`; text is cut at a stop string, token ids never are.

        A stop token (EOS or `stop_token_ids`) stays in `token_ids`; its text is kept only with
        `include_stop_str_in_output`, as vLLM does (special tokens are left out by decoding anyway). As in vLLM,
        `stop_reason` names the stop string or `stop_token_ids` entry that ended the sample, and is None for EOS.
        """
        stop_reason = row.stop_reason
        ended_on_token = isinstance(stop_reason, int)
        if ended_on_token and stop_reason not in request.sampling.stop_token_ids:
            stop_reason = None  # the model's own EOS
        text_ids = row.token_ids
        if ended_on_token and not request.sampling.include_stop_str_in_output:
            text_ids = row.token_ids[:-1]
        text = self.tokenizer.decode(text_ids, skip_special_tokens=self.config.skip_special_tokens)
        if row.finish_reason == "stop" and not ended_on_token and request.sampling.stop:
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
            policy_versions=list(row.policy_versions),
        )

    # -- weights -------------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy new weights into the model in place (skipped for tensors that already are the model's).

        Paused (`pause_generation`), it loads at once: every decode is parked at a token boundary, still holding
        the model's lock, and goes on under the new weights at `resume_generation`."""
        if self._gate.paused:
            self._load(named_tensors)
            return
        with self._lock:
            self._load(named_tensors)

    def _load(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        load_named_tensors(self.model, named_tensors)
        self._loads += 1
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        # the cache now holds nothing of the old weights, and what a decode (re-)prefills from here on may seed it
        self._weights_version = self._parameter_versions()

    # -- in-flight weight updates (core-rl's InflightWeightUpdate) -----------------------------------------
    def pause_generation(self) -> None:
        """Stop every running request at its next token boundary (returns once they all stopped); requests
        submitted from now on wait. Change the weights (`update_weights`, or the shared actor's optimizer step),
        then `resume_generation`."""
        self._gate.pause()
        self._weights_at_pause = self._weights_fingerprint()

    def resume_generation(self, policy_version: int) -> None:
        """Continue the paused requests under the current weights, with the keys/values computed so far kept or
        recomputed (`inflight_kv`); every token sampled from now on is labelled `policy_version`. A pause in
        which no parameter was written (nor the version moved) recomputes nothing: the keys/values still hold."""
        changed = self._weights_fingerprint() != self._weights_at_pause or policy_version != self._gate.version
        self._gate.resume(policy_version, weights_changed=changed)

    @property
    def keeps_kv_cache(self) -> bool:
        """Whether a paused request keeps its keys/values (computed under the old weights) and feeds on
        (`inflight_kv="keep"`), rather than re-prefilling its prompt and tokens under the new ones."""
        return self.config.inflight_kv == "keep"

    @property
    def policy_version(self) -> int:
        """The version the tokens sampled now are labelled with (the last `resume_generation`'s; 0 before)."""
        return self._gate.version


def honour_thread_setting() -> None:
    """Apply `torch.set_num_threads` to the calling thread too.

    torch keeps the setting in OpenMP's per-thread state, so a thread started later runs its ops on as many
    threads as the machine has cores whatever the process asked for (a worker would then compete with the
    threads that call it, and a benchmark would compare unequal thread counts).
    """
    torch.set_num_threads(torch.get_num_threads())


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


def _vision_token_ids(model_config: Any) -> tuple[int, ...]:
    """Ids a VLM must not generate (Qwen-VL config names): a sampled image pad breaks the actor's forward."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id")
    return tuple(sorted({v for n in names if isinstance(v := getattr(model_config, n, None), int)}))


def _tokens(completions: Sequence[Completion]) -> int:
    return sum(len(c.token_ids) for c in completions)


def _cancel_check(ticket: Ticket) -> Callable[[], bool]:
    """Whether `ticket`'s caller has stopped waiting, asked as the decode goes."""
    return lambda: ticket.cancelled


def _is_text(request: GenerationRequest) -> bool:
    return not request.multimodal


def _reraise(error: BaseException) -> NoReturn:
    raise error


@dataclass(slots=True)
class _Job:
    """A request being decoded: where its completions go and which of its samples have finished."""

    request: GenerationRequest
    deliver: Callable[[list[Completion]], None]
    fail: Callable[[BaseException], None]
    cancelled: Callable[[], bool] = lambda: False  # the caller stopped waiting (an `agenerate` task cancelled)
    finished: list[SampleRow] = field(default_factory=list)


class _RowFeed:
    """The `admit` source of a continuous decode: sample rows of accepted requests, handed out as room frees.

    Rows of one request may join in several steps (n larger than the free room); the request is answered
    when its last sample finishes, or failed if any of its prefills raised.
    """

    def __init__(self, engine: HFEngine, take: Callable[[int], list[Any]] | None = None) -> None:
        self.engine = engine
        self.take = take  # pulls more tickets from the batcher's queue when the backlog runs dry
        self.jobs: dict[int, _Job] = {}
        self.backlog: deque[SampleRow] = deque()
        self._next_id = 0

    def add(
        self,
        request: GenerationRequest,
        deliver: Callable[[list[Completion]], None],
        fail: Callable[[BaseException], None],
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        """Accept a request (or fail its caller at once if its prompt is unusable)."""
        if cancelled():  # its caller gave up while it waited in the queue: do not prefill it at all
            return
        try:
            prompt = self.engine.prompt_ids(request)
            self.engine._check_prompt(request, prompt)
            rows = [self.engine._make_row(self._next_id, s, prompt, request) for s in range(request.sampling.n)]
        except Exception as exc:
            fail(exc)
            return
        self.jobs[self._next_id] = _Job(request, deliver, fail, cancelled)
        self._next_id += 1
        self.backlog.extend(rows)

    def add_ticket(self, ticket: Ticket) -> None:
        """Accept a batcher ticket; its rows are dropped once its caller is cancelled."""
        self.add(ticket.request, ticket.deliver, ticket.fail, lambda: ticket.cancelled)

    def __call__(self, room: int) -> list[SampleRow]:
        if not self.backlog and self.take is not None:
            for ticket in self.take(room):
                self.add_ticket(ticket)
        out: list[SampleRow] = []
        while self.backlog and len(out) < room:
            row = self.backlog.popleft()
            if not self.abandoned(row):  # rows of a failed or cancelled request are dropped
                out.append(row)
        return out

    def abandoned(self, row: SampleRow) -> bool:
        """Whether nobody waits for `row` any more: its request failed, or its caller was cancelled."""
        job = self.jobs.get(row.request_index)
        if job is not None and job.cancelled():
            del self.jobs[row.request_index]
            job = None
        return job is None

    def on_finish(self, row: SampleRow) -> None:
        job = self.jobs.get(row.request_index)
        if job is None:  # its request already failed
            return
        job.finished.append(row)
        if len(job.finished) == job.request.sampling.n:
            del self.jobs[row.request_index]
            rows = sorted(job.finished, key=lambda r: r.sample_index)
            job.deliver([self.engine._completion(job.request, r) for r in rows])

    def on_error(self, rows: list[SampleRow], error: BaseException) -> None:
        for index in dict.fromkeys(r.request_index for r in rows):
            job = self.jobs.pop(index, None)
            if job is not None:
                job.fail(error)
