"""Fixtures: the character tokenizer, and a replay engine that returns scripted model turns as token ids.

The replay engine stands in for a policy in unit tests of the loop (the issue allows it); the real `HFEngine`
runs in test_hf_engine_integration.py. It behaves like a real engine on the points the loop relies on: it
receives token ids, stops right after a stop string (keeping it in the ids, and in the text unless
`include_stop_str_in_output` is off), appends EOS when the scripted text ends
naturally, honours max_tokens (finish 'length'), and returns one distinct logprob per token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.tiny import char_tokenizer
from rlloom.retrieval import Hit

Script = Callable[[str], str]


class ReplayEngine:
    """Plays `script(context_text) -> next turn text` as if sampled."""

    def __init__(self, tokenizer: Any, script: Script, *, delay_s: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.delay_s = delay_s
        self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.requests: list[GenerationRequest] = []
        self.calls = 0

    def _complete(self, request: GenerationRequest) -> Completion:
        assert request.prompt_ids is not None, "the agent loop must send token ids"
        self.requests.append(request)
        self.calls += 1
        context = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
        text = self.script(context)
        stop_hit = None
        for stop in request.sampling.stop:
            pos = text.find(stop)
            if pos >= 0 and (stop_hit is None or pos + len(stop) < stop_hit[1]):
                stop_hit = (stop, pos + len(stop))
        if stop_hit is not None:
            text = text[: stop_hit[1]]
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        finish = "stop"
        if stop_hit is None:
            ids.append(self.tokenizer.eos_token_id)
        if len(ids) > request.sampling.max_tokens:
            ids, finish = ids[: request.sampling.max_tokens], "length"
        logprobs = [-0.01 * (self.calls + k) for k in range(len(ids))]
        out_text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if stop_hit is not None and finish == "stop" and not request.sampling.include_stop_str_in_output:
            out_text = out_text[: len(out_text) - len(stop_hit[0])]  # as HFEngine/vLLM: ids keep it, text not
        return Completion(
            request_id=request.request_id,
            prompt_ids=list(request.prompt_ids),
            token_ids=ids,
            text=out_text,
            finish_reason=finish,
            logprobs=logprobs,
            stop_reason=stop_hit[0] if stop_hit else None,
        )

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return [self._complete(request)]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [[self._complete(r)] for r in requests]

    def update_weights(self, named_tensors: Mapping[str, Any]) -> None:
        return None  # replayed text has no weights


class FixedRetriever:
    """Returns the same real `Hit`s for any query and records the queries (a test double of a Retriever)."""

    def __init__(self, hits: list[Hit], delay_s: float = 0.0) -> None:
        self.hits = hits
        self.delay_s = delay_s
        self.queries: list[str] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.queries.extend(queries)
        return [self.hits[:k] for _ in queries]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return char_tokenizer()


@pytest.fixture(scope="session")
def replay_engine() -> type[ReplayEngine]:
    return ReplayEngine


@pytest.fixture(scope="session")
def fixed_retriever() -> type[FixedRetriever]:
    return FixedRetriever


@pytest.fixture(scope="session")
def hit() -> Any:
    return lambda doc_id, score, text, title: Hit(doc_id=doc_id, score=score, text=text, title=title)
