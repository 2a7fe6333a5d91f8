"""Partial rollouts by re-prefill (`trainer.streaming.partial_rollout=reprefill`): each response is generated in
chunks of `chunk_tokens`, every chunk continuing the prompt and the tokens so far as a new prompt under the weights
current when it starts. A weight push then waits only for the chunks in progress, on any engine (those without
`InflightWeightUpdate` too); each token is labelled with the version of its chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlloom.core_rl.contracts.engines import HasTokenizer, RolloutEngine
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import Row, generation_request
from rlloom.core_rl.phases.collection import CollectFn, trajectories_from_completions
from rlloom.core_rl.streaming.gate import UpdateGate


@dataclass(slots=True)
class _Sample:
    """One response being built chunk by chunk."""

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reason: str = "length"
    done: bool = False
    stop_at: tuple[int, str] | None = None  # a stop string found across two chunks: where it starts in the text


def chunked_collector(
    engine: RolloutEngine,
    generate: Callable[[list[GenerationRequest]], list[list[Completion]]],
    gate: UpdateGate,
    version: Callable[[], int],
    *,
    chunk_tokens: int,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> CollectFn:
    """A single-turn `CollectFn` generating in chunks with `generate` (the engine's, or `LoopGenerate`); each chunk
    holds the gate for reading and its tokens get `version()` read under it."""

    def chunk(requests: list[GenerationRequest]) -> tuple[list[list[Completion]], int]:
        with gate.reading():
            return generate(requests), version()

    def collect(rows: Sequence[Row], sampling: SamplingParams, prefix: str) -> list[Trajectory]:
        requests = [generation_request(row, sampling, chat_template_kwargs) for row in rows]
        first = [
            GenerationRequest(
                prompt_ids=r.prompt_ids,
                messages=r.messages,
                sampling=sampling.model_copy(update={"max_tokens": min(chunk_tokens, sampling.max_tokens)}),
                multimodal=r.multimodal,
                chat_template_kwargs=r.chat_template_kwargs,
            )
            for r in requests
        ]
        tokenizer = engine.tokenizer if isinstance(engine, HasTokenizer) else None
        outputs, v = chunk(first)
        samples = [[_start(c, v, sampling.max_tokens) for c in completions] for completions in outputs]
        while live := [s for group in samples for s in group if not s.done]:
            single = [
                GenerationRequest(
                    prompt_ids=s.prompt_ids + s.tokens,
                    sampling=sampling.model_copy(
                        update={"n": 1, "max_tokens": min(chunk_tokens, sampling.max_tokens - len(s.tokens))}
                    ),
                )
                for s in live
            ]
            outputs, v = chunk(single)
            for s, completions in zip(live, outputs, strict=True):
                before = len(s.tokens)
                _extend(s, completions[0], v, sampling.max_tokens)
                _stop_across_chunks(s, before, sampling.stop, tokenizer)
        stitched = [
            [
                _completion(s, r.request_id, k, tokenizer, sampling.include_stop_str_in_output)
                for k, s in enumerate(group)
            ]
            for r, group in zip(requests, samples, strict=True)
        ]
        return trajectories_from_completions(rows, requests, stitched, prefix)

    return collect


def _start(completion: Completion, version: int, max_tokens: int) -> _Sample:
    sample = _Sample(prompt_ids=list(completion.prompt_ids))
    _extend(sample, completion, version, max_tokens)
    return sample


def _extend(sample: _Sample, completion: Completion, version: int, max_tokens: int) -> None:
    """Append one chunk; the sample is done at a stop, or at the response limit."""
    sample.tokens += completion.token_ids
    sample.logprobs += completion.logprobs if completion.logprobs is not None else [0.0] * len(completion.token_ids)
    labels = completion.policy_versions  # an engine that labels its own tokens knows better
    sample.versions += list(labels) if labels is not None else [version] * len(completion.token_ids)
    sample.texts.append(completion.text)
    sample.finish_reason = completion.finish_reason
    sample.done = completion.finish_reason != "length" or len(sample.tokens) >= max_tokens or not completion.token_ids


def _stop_across_chunks(sample: _Sample, before: int, stops: Sequence[str], tokenizer: Any) -> None:
    """A stop string that straddles two chunks, which neither chunk's request could see: end the sample at the token
    that completes it, as an engine does (token ids end there; the text is cut at the stop). Needs the engine's
    tokenizer to map text back to tokens (without one, such a stop is missed)."""
    if not stops or tokenizer is None or before == 0:
        return
    head = tokenizer.decode(sample.tokens[:before], skip_special_tokens=True)
    start = max(0, len(head) - max(len(s) for s in stops) + 1)  # an occurrence must end past the old text

    def first_stop(k: int) -> tuple[int, str] | None:
        text = tokenizer.decode(sample.tokens[:k], skip_special_tokens=True)
        hits = [(text.find(s, start), s) for s in stops if s and text.find(s, start) >= 0]
        return min(hits) if hits else None

    if first_stop(len(sample.tokens)) is None:  # the common case: one decode
        return
    k = next(k for k in range(before + 1, len(sample.tokens) + 1) if first_stop(k) is not None)
    sample.stop_at = first_stop(k)
    del sample.tokens[k:], sample.logprobs[k:], sample.versions[k:]
    sample.finish_reason, sample.done = "stop", True


def _completion(sample: _Sample, request_id: str, index: int, tokenizer: Any, include_stop: bool) -> Completion:
    text = tokenizer.decode(sample.tokens, skip_special_tokens=True) if tokenizer is not None else "".join(sample.texts)
    if sample.stop_at is not None:
        at, stop = sample.stop_at
        text = text[: at + len(stop)] if include_stop else text[:at]
    return Completion(
        request_id=request_id,
        prompt_ids=sample.prompt_ids,
        token_ids=sample.tokens,
        text=text,
        finish_reason="stop" if sample.finish_reason == "stop" else sample.finish_reason,  # type: ignore[arg-type]
        logprobs=sample.logprobs,
        sample_index=index,
        policy_versions=sample.versions,
    )


__all__ = ["chunked_collector"]
