"""Long-tailed responses for the async RL benchmark (bench/async_agent_vllm.py, issue 42): tiny models end their
turns and answers after a handful of tokens, so after the model stops the engine keeps sampling (EOS ignored, no
stop strings) up to a total length drawn from a lognormal, as a verbose reasoning model's lengths would be.

`LongTailTurns` does it to an agent's turns (not after a `</search>`: the passages follow and the policy has to copy
from them), `LongTailResponses` to single-turn answers (every sample of a request). Every sampled token is
trained; what the task reads is what the model wrote before it stopped: the agent's environment gets the turn's
first text, and a single-turn reward goes through `eos_cut_reward`, which scores the response cut at its first
EOS. A draw is seeded by the run's seed, the context tokens and how often that context was asked in this run.
Not a benchmark itself: `nox -s bench` skips files whose name starts with `_`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import random
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory


class TailLengths:
    """Seeded lognormal totals (median, sigma, cap) per context, and what each response came to."""

    def __init__(self, *, seed: int, median: float, cap: int, sigma: float = 1.0) -> None:
        self.seed, self.median, self.cap, self.sigma = seed, median, cap, sigma
        self.seen: dict[str, int] = {}
        self.natural: list[int] = []  # tokens of each response as the model ended it
        self.total: list[int] = []  # ... and with its tail
        self.lock = threading.Lock()  # async mode runs groups on threads of their own

    def draw(self, prompt_ids: Sequence[int]) -> int:
        key = hashlib.sha256(str(list(prompt_ids)).encode()).hexdigest()
        with self.lock:
            nth = self.seen.get(key, 0)
            self.seen[key] = nth + 1
        rng = random.Random(f"{self.seed}|{key}|{nth}")
        return max(1, min(self.cap, round(self.median * math.exp(rng.gauss(0.0, self.sigma)))))

    def record(self, natural: int, total: int) -> None:
        with self.lock:
            self.natural.append(natural)
            self.total.append(total)

    def tail_request(
        self, request: GenerationRequest, first: Completion, *, allow: bool = True
    ) -> GenerationRequest | None:
        """The continuation of `first` up to its drawn length, or None (none drawn, or not `allow`ed: recorded as
        it is). The draw is made either way, so the draws that follow do not depend on `allow`."""
        prompt = list(request.prompt_ids or first.prompt_ids)
        extra = min(self.draw(prompt), request.sampling.max_tokens) - len(first.token_ids)
        if not allow or extra <= 0 or first.finish_reason != "stop":
            self.record(len(first.token_ids), len(first.token_ids))
            return None
        sampling = request.sampling.model_copy(
            update={"n": 1, "max_tokens": extra, "ignore_eos": True, "stop": [], "stop_token_ids": [], "seed": None}
        )
        return GenerationRequest(prompt_ids=[*prompt, *first.token_ids], sampling=sampling)

    def joined(self, first: Completion, tail: Completion, text: str) -> Completion:
        """`first` with `tail`'s tokens, log-probs and versions after its own; `text` is what the task reads."""
        self.record(len(first.token_ids), len(first.token_ids) + len(tail.token_ids))
        logprobs = None if first.logprobs is None or tail.logprobs is None else [*first.logprobs, *tail.logprobs]
        versions = None
        if first.policy_versions is not None and tail.policy_versions is not None:
            versions = [*first.policy_versions, *tail.policy_versions]
        latency = first.timing.get("latency_s", 0.0) + tail.timing.get("latency_s", 0.0)
        return dataclasses.replace(
            first,
            token_ids=[*first.token_ids, *tail.token_ids],
            text=text,
            logprobs=logprobs,
            policy_versions=versions,
            timing={"latency_s": latency},
        )


class _Wrapped:
    """Everything but generation, capabilities included, is the wrapped engine's."""

    def __init__(self, engine: Any, lengths: TailLengths) -> None:
        self.engine, self.lengths = engine, lengths

    def __getattr__(self, name: str) -> Any:  # pause/resume, syncs, tokenizer, close ...
        return getattr(self.engine, name)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.engine.update_weights(named_tensors)


class LongTailTurns(_Wrapped):
    """An agent's turns continued past their action; the environment reads the action (the first text)."""

    search_stop = "</search>"

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        first = (await self.engine.agenerate(request))[0]
        # not after a search: the passages follow and the model must copy from them (the warm-up never saw a tail
        # there, and with one the policy did not learn to: sampled reward 0.02-0.03 in a smoke run)
        tail_request = self.lengths.tail_request(request, first, allow=first.stop_reason != self.search_stop)
        if tail_request is None:
            return [first]
        tail = (await self.engine.agenerate(tail_request))[0]
        return [self.lengths.joined(first, tail, first.text)]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        raise NotImplementedError("LongTailTurns serves AgentLoop, which calls agenerate")


class LongTailResponses(_Wrapped):
    """Single-turn answers (all n of a request) continued past EOS; the text holds the tail too, so the reward must
    cut it (`eos_cut_reward`)."""

    def _plan(self, request: GenerationRequest, firsts: Sequence[Completion]) -> list[GenerationRequest | None]:
        return [self.lengths.tail_request(request, first) for first in firsts]

    def _join(self, firsts: Sequence[Completion], plan: Sequence[Any], tails: list[Completion]) -> list[Completion]:
        out = []
        for first, tail_request in zip(firsts, plan, strict=True):
            tail = tails.pop(0) if tail_request is not None else None
            out.append(first if tail is None else self.lengths.joined(first, tail, first.text + tail.text))
        return out

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        firsts = await self.engine.agenerate(request)
        plan = self._plan(request, firsts)
        tails = await asyncio.gather(*(self.engine.agenerate(r) for r in plan if r is not None))
        return self._join(firsts, plan, [t[0] for t in tails])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        firsts = self.engine.generate(list(requests))
        plans = [self._plan(r, f) for r, f in zip(requests, firsts, strict=True)]
        wanted = [r for plan in plans for r in plan if r is not None]
        tails = [t[0] for t in self.engine.generate(wanted)] if wanted else []
        return [self._join(f, plan, tails) for f, plan in zip(firsts, plans, strict=True)]


def cut_at_eos(token_ids: Sequence[int], eos_ids: Collection[int]) -> list[int]:
    """The tokens before the first EOS (all of them when there is none)."""
    for i, token in enumerate(token_ids):
        if token in eos_ids:
            return list(token_ids[:i])
    return list(token_ids)


RewardFn = Callable[[Sequence[Trajectory]], list[RewardOutput]]


def eos_cut_reward(reward_fn: RewardFn, tokenizer: Any, eos_ids: Collection[int] | None = None) -> RewardFn:
    """`reward_fn` scoring each response as the model ended it: the text of its tokens before the first EOS
    (`eos_ids`, default the tokenizer's EOS), so a tail sampled past EOS never counts."""
    stops = set(eos_ids) if eos_ids is not None else {int(tokenizer.eos_token_id)}

    def score(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
        cut = [
            dataclasses.replace(
                traj, response_text=tokenizer.decode(cut_at_eos(traj.response_ids, stops), skip_special_tokens=True)
            )
            for traj in trajectories
        ]
        return reward_fn(cut)

    return score
