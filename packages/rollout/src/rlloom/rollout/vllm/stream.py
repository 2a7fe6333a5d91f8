"""Continuous batching on the offline `LLM`, for `VLLMEngine.agenerate`: a request joins vLLM's running batch at
the next engine step instead of waiting for the batch before it to finish.

Agents call `agenerate` once per turn per conversation. Batched a run at a time (`AsyncBatcher`), a turn whose
tool returned while a batch decoded waited for that whole batch; `VLLMAsyncEngine` streams instead, but through
vLLM's `AsyncLLM`, whose engine core (and on CPU its worker) are processes of their own: every step's outputs are
serialised and decoded across a process hop, and on CPU the engine core and worker spin-wait (`sched_yield`) on
each other. Here vLLM's `LLMEngine` is stepped on the batcher's thread, in this process (as `LLM.generate`
steps it), and new requests are added between steps: the stream with no process hop. The engine's lock is held
for the run, so a weight sync never lands between two tokens of one request; a sync that is waiting stops the
intake, the running requests finish, and the sync runs before the next run takes the rest.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlloom.core_rl.contracts.generation import Completion
from rlloom.core_rl.observe import progress
from rlloom.rollout.batching import TakeTickets, Ticket
from rlloom.rollout.vllm.conversions import completion_of, vllm_sampling_kwargs
from rlloom.rollout.vllm.images import check_expanded

if TYPE_CHECKING:
    from rlloom.rollout.vllm.engine import VLLMEngine

_IDS = itertools.count()


@dataclass
class _Live:
    """A ticket whose request is in vLLM, with when it went in."""

    ticket: Ticket
    started: float = field(default_factory=time.perf_counter)


def stream(engine: VLLMEngine, first: list[Ticket], take: TakeTickets, version: int) -> None:
    """Step vLLM until no request is left: `first`, then new tickets (up to `max_batch_rows` samples in flight)
    taken before every step unless a weight sync waits; answer each ticket the step its request finishes. Call
    with the engine's lock held and its weights ready; `version` labels every token."""
    core = engine.llm.llm_engine
    live: dict[str, _Live] = {}
    rows = 0
    try:
        while True:
            new = first if first else [] if engine.sync_waiting else take(engine.config.max_batch_rows - rows)
            first = []
            for ticket in new:
                if not ticket.cancelled and (request_id := _add(engine, ticket)) is not None:
                    live[request_id] = _Live(ticket)
                    rows += ticket.rows
            if not live:
                return
            for out in core.step():
                if not out.finished or (entry := live.pop(out.request_id, None)) is None:
                    continue
                rows -= entry.ticket.rows
                request = entry.ticket.request
                if request.multimodal:
                    check_expanded(request.request_id, request.prompt_ids or [], out.prompt_token_ids)
                latency = time.perf_counter() - entry.started
                done: list[Completion] = [
                    completion_of(request, out.prompt_token_ids, c, latency, version) for c in out.outputs
                ]
                progress.advance(len(done), tokens=sum(len(c.token_ids) for c in done), unit="samples")
                entry.ticket.deliver(done)
            if gone := [request_id for request_id, entry in live.items() if entry.ticket.cancelled]:
                core.abort_request(gone)  # nobody waits for them (the caller timed out or was cancelled)
                for request_id in gone:
                    rows -= live.pop(request_id).ticket.rows
    finally:
        if live:  # a step raised: leave nothing of this run in vLLM for the next one to step
            core.abort_request(list(live))


def _add(engine: VLLMEngine, ticket: Ticket) -> str | None:
    """Put one ticket's request into vLLM; a request vLLM refuses fails its own caller only (None)."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from rlloom.rollout.vllm.images import engine_prompt

    request = ticket.request
    try:
        prompt = TokensPrompt(**engine_prompt(request, engine.tokenizer, engine.image_layout))  # type: ignore[typeddict-item]
        bias = engine.image_layout.logit_bias() if engine.image_layout else None
        params: Any = engine._vllm.SamplingParams(
            **vllm_sampling_kwargs(
                request.sampling, skip_special_tokens=engine.config.skip_special_tokens, logit_bias=bias
            )
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, as `LLM.generate` asks
        request_id = f"rlloom-stream-{next(_IDS)}"  # vLLM's outputs carry this id (it adds a suffix inside)
        engine.llm.llm_engine.add_request(request_id, prompt, params)
    except Exception as exc:  # e.g. a prompt longer than the context: that caller's error, not the batch's
        ticket.fail(exc)
        return None
    return request_id
