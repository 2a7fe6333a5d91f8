"""HFEngine's in-flight weight updates (core-rl's `InflightWeightUpdate`): pause at a token boundary, new weights,
resume; the tokens after the resume are the new weights' and carry the new policy version.

The weight change touches only the final norm (`model.norm.weight`), which no key or value depends on: the keys and
values the paused request keeps are then exactly what the new weights compute too, so the reference is
independent of the engine's pause machinery: a second engine that starts from the new weights, given the prompt
plus the tokens sampled before the pause.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save

from rlloom.core_rl.contracts.engines import InflightWeightUpdate
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import move_from_start, tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

MAX_TOKENS = 300


@pytest.fixture
def sharp(tok: Any) -> torch.nn.Module:
    """A tiny model moved far from its near-uniform start, so its greedy text varies (not one repeated token)
    and its choices are far from ties."""
    return move_from_start(tiny_qwen2(tok, seed=0), seed=6)


def _new_norm(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """New weights for the final norm only (signs flipped at random: the greedy text changes)."""
    gen = torch.Generator().manual_seed(3)
    norm = model.get_parameter("model.norm.weight")
    return {"model.norm.weight": torch.randn(norm.shape, generator=gen) * 2.0}


def _greedy(prompt: list[int], max_tokens: int = MAX_TOKENS) -> GenerationRequest:
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=True)
    return GenerationRequest(prompt_ids=prompt, sampling=sampling)


def _wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.0005)


def test_paused_request_continues_under_the_new_weights_with_their_version(
    sharp: torch.nn.Module, tok: Any, encode: Any
) -> None:
    old_model = copy.deepcopy(sharp)
    new_weights = _new_norm(sharp)
    new_model = copy.deepcopy(sharp)
    new_model.load_state_dict(new_weights, strict=False)
    engine = HFEngine(sharp, tok, HFEngineConfig(gather_s=0.0))
    assert isinstance(engine, InflightWeightUpdate) and engine.keeps_kv_cache
    prompt, late_prompt = encode("the weights change"), encode("late")
    results: dict[str, list[Completion]] = {}

    def caller(name: str, request: GenerationRequest) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.update({name: asyncio.run(engine.agenerate(request))}))
        thread.start()
        return thread

    try:
        first = caller("first", _greedy(prompt))
        _wait_for(lambda: engine.decode_stats.steps >= 5)
        engine.pause_generation()
        steps_at_pause = engine.decode_stats.steps
        late = caller("late", _greedy(late_prompt, 20))
        time.sleep(0.3)
        assert not results and engine.decode_stats.steps == steps_at_pause  # nothing decodes while paused
        engine.update_weights(new_weights)
        engine.resume_generation(7)
        first.join(60)
        late.join(60)
    finally:
        engine.close()

    [paused] = results["first"]
    k = paused.policy_versions.index(7) if paused.policy_versions else -1
    assert 5 <= k < MAX_TOKENS, f"the pause should fall mid-generation (first new-version token at {k})"
    assert paused.policy_versions == [0] * k + [7] * (MAX_TOKENS - k)
    old_engine, new_engine = HFEngine(old_model, tok), HFEngine(new_model, tok)
    try:
        [[old_all]] = old_engine.generate([_greedy(prompt)])
        [[continued]] = new_engine.generate([_greedy(prompt + paused.token_ids[:k], MAX_TOKENS - k)])
        [[late_reference]] = new_engine.generate([_greedy(late_prompt, 20)])
    finally:
        old_engine.close()
        new_engine.close()
    assert len(set(old_all.token_ids[:k])) > 1  # a real text, not one token repeated
    assert paused.token_ids[:k] == old_all.token_ids[:k]  # before the pause: the old weights' greedy text
    assert paused.token_ids[k:] == continued.token_ids  # after it: the new weights' continuation of that prefix
    assert paused.token_ids[k:] != old_all.token_ids[k:]  # and the change is visible in the text
    assert paused.logprobs is not None and continued.logprobs is not None
    assert paused.logprobs[k:] == pytest.approx(continued.logprobs, abs=1e-4)
    # the request sent during the pause waited, then ran wholly under the new weights
    [late_done] = results["late"]
    assert late_done.token_ids == late_reference.token_ids and late_done.policy_versions == [7] * 20


def test_versions_start_at_zero_and_follow_resume(model: torch.nn.Module, tok: Any, encode: Any) -> None:
    """Without a pause every token carries the current version; a resume alone relabels what follows."""
    engine = HFEngine(model, tok)
    try:
        [[before]] = engine.generate([_greedy(encode("ab"), 4)])
        engine.resume_generation(2)
        [[after]] = engine.generate([_greedy(encode("ab"), 4)])
        [after_async] = asyncio.run(engine.agenerate(_greedy(encode("ab"), 3)))
    finally:
        engine.close()
    assert before.policy_versions == [0] * 4 and after.policy_versions == [2] * 4
    assert after_async.policy_versions == [2] * 3 and engine.policy_version == 2


def test_keys_of_a_request_spanning_an_update_never_seed_the_prefix_cache(
    sharp: torch.nn.Module, tok: Any, encode: Any
) -> None:
    """A finished row whose keys/values span the update is not stored: the next turn extending it is prefilled
    afresh under the new weights (no reused tokens), while one extending a post-update answer reuses its keys."""
    engine = HFEngine(sharp, tok, HFEngineConfig(gather_s=0.0, prefix_cache_tokens=10_000))
    prompt = encode("a conversation")
    done: list[Completion] = []
    try:
        thread = threading.Thread(target=lambda: done.extend(asyncio.run(engine.agenerate(_greedy(prompt)))))
        thread.start()
        _wait_for(lambda: engine.decode_stats.steps >= 5)
        engine.pause_generation()
        engine.update_weights(_new_norm(sharp))
        engine.resume_generation(1)
        thread.join(60)
        [spanning] = done
        reused = engine.decode_stats.reused_tokens
        [[fresh]] = engine.generate([_greedy(prompt + spanning.token_ids + encode(" next"), 3)])
        assert engine.decode_stats.reused_tokens == reused  # nothing of the spanning row was cached
        [[again]] = engine.generate([_greedy(prompt + spanning.token_ids + encode(" next") + fresh.token_ids, 3)])
        assert engine.decode_stats.reused_tokens > reused  # a row wholly under the new weights is
    finally:
        engine.close()
    assert set(again.policy_versions or []) == {1}


def test_the_server_pauses_and_resumes_its_engine_and_labels_tokens(served: Any, engine: HFEngine, encode: Any) -> None:
    """rlloom's OpenAI-compatible server over HFEngine: /v1/pause_generation holds a request sent meanwhile,
    weights load while paused, /v1/resume_generation lets it run under the new version, and the choices carry
    `policy_versions`, which `OpenAIEngine` reads back."""
    from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineConfig

    client = OpenAIEngine(OpenAIEngineConfig(base_url=served.base_url, model="tiny", max_retries=0))
    paused = httpx.post(served.base_url + "/pause_generation", timeout=60)
    assert paused.status_code == 200 and paused.json() == {"paused": True, "keeps_kv_cache": True}
    done: list[Completion] = []
    thread = threading.Thread(target=lambda: done.extend(client.generate([_greedy(encode("hi"), 6)])[0]))
    thread.start()
    time.sleep(0.5)
    assert not done  # waits while paused
    new = save({k: v.contiguous() for k, v in _new_norm(engine.model).items()})
    loaded = httpx.post(
        served.base_url + "/update_weights", content=new, headers={"content-type": "application/octet-stream"}
    )
    assert loaded.status_code == 200
    resumed = httpx.post(served.base_url + "/resume_generation", json={"policy_version": 4}, timeout=60)
    assert resumed.status_code == 200 and resumed.json() == {"paused": False, "policy_version": 4}
    thread.join(60)
    [completion] = done
    assert completion.policy_versions == [4] * 6
    [[direct]] = engine.generate([_greedy(encode("hi"), 6)])
    assert completion.token_ids == direct.token_ids
    missing = httpx.post(served.base_url + "/resume_generation", json={}, timeout=60)
    assert missing.status_code == 400 and "policy_version" in missing.text


def test_a_server_over_an_engine_without_inflight_updates_refuses_with_the_reason(
    engine: HFEngine, tok: Any, server_thread: Any
) -> None:
    from rlloom.rollout.openai.server import create_app

    class Plain:  # an engine with generation only
        context_window = engine.context_window

        async def agenerate(self, request: GenerationRequest) -> list[Completion]:
            return await engine.agenerate(request)

    with server_thread(create_app(Plain(), "tiny", tok)) as srv:  # type: ignore[arg-type]
        r = httpx.post(srv.base_url + "/pause_generation", timeout=60)
    assert r.status_code == 400 and "pause_generation" in r.json()["error"]["message"]


def test_closing_a_paused_engine_does_not_hang(model: torch.nn.Module, tok: Any, encode: Any) -> None:
    engine = HFEngine(model, tok, HFEngineConfig(gather_s=0.0))
    thread = threading.Thread(target=lambda: asyncio.run(engine.agenerate(_greedy(encode("ab"), 60))))
    thread.start()
    _wait_for(lambda: engine.decode_stats.steps >= 2)
    engine.pause_generation()
    engine.close()
    thread.join(30)
    assert not thread.is_alive()
