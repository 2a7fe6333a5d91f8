"""Prefix caching: a prompt that extends a finished sequence reuses its keys/values and decodes the same.

References are independent of the cache: the same requests through an engine without one, and a plain fp32
forward pass over prompt + completion for the logprobs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig
from rlloom.rollout.hf.prefix_cache import PrefixCache

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=True, ignore_eos=True)


def _fake_layers(tokens: list[int], n_layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys whose value at position i is the token there (plus the layer), so slices can be checked by eye."""
    column = torch.tensor(tokens, dtype=torch.float32).view(1, -1, 1)
    return [(column + layer, -(column + layer)) for layer in range(n_layers)]


def test_lookup_returns_the_longest_stored_prefix_and_its_keys() -> None:
    cache = PrefixCache(capacity_tokens=1000, block_size=4, min_hit_tokens=4)
    stored = list(range(100, 140))  # 40 tokens
    cache.insert(stored, _fake_layers(stored))

    hit = cache.lookup([*stored, 7, 8, 9])  # an extension (the next turn of a conversation)
    assert hit is not None and hit.length == 40
    assert hit.layers[1][0].flatten().tolist() == [t + 1.0 for t in stored]

    same = cache.lookup(stored)  # the whole prompt is cached: its last token must still run (it gives logits)
    assert same is not None and same.length == 39

    diverging = [*stored[:22], 999, *stored[23:]]  # matches 22 tokens: past a block boundary (20), not to 24
    hit = cache.lookup(diverging)
    assert hit is not None and hit.length == 22
    assert hit.layers[0][1].flatten().tolist() == [-float(t) for t in stored[:22]]

    assert cache.lookup([1, 2, *stored]) is None  # same tokens, not a prefix
    assert cache.lookup(stored[:3] + [0] * 10) is None  # shorter than min_hit_tokens


def test_capacity_evicts_the_least_recently_used_entry() -> None:
    cache = PrefixCache(capacity_tokens=100, block_size=4, min_hit_tokens=4)
    a, b, c = ([k] * 40 for k in (1, 2, 3))
    cache.insert(a, _fake_layers(a))
    cache.insert(b, _fake_layers(b))
    assert cache.lookup([*a, 0]) is not None  # a is now the most recently used
    cache.insert(c, _fake_layers(c))  # 120 tokens > 100: b goes, not a
    assert cache.lookup([*b, 0]) is None
    assert cache.lookup([*a, 0]) is not None and cache.lookup([*c, 0]) is not None
    assert cache.stored_tokens == 80 and len(cache) == 2
    cache.clear()
    assert cache.lookup([*a, 0]) is None and cache.stored_tokens == 0


def test_a_hash_pointing_at_other_tokens_is_never_trusted() -> None:
    cache = PrefixCache(capacity_tokens=1000, block_size=4, min_hit_tokens=4)
    stored = list(range(40))
    cache.insert(stored, _fake_layers(stored))
    other = list(range(500, 540))
    (entry_id,) = set(cache._by_hash.values())
    for h in cache._chain(other, len(other)):  # forge a collision: other's block hashes name stored's entry
        cache._by_hash[h] = entry_id
    assert cache.lookup([*other, 1]) is None


def test_mismatched_keys_are_refused() -> None:
    cache = PrefixCache(capacity_tokens=1000, block_size=4)
    with pytest.raises(ValueError, match="positions"):
        cache.insert(list(range(20)), _fake_layers(list(range(19))))
    with pytest.raises(ValueError, match="capacity_tokens"):
        PrefixCache(capacity_tokens=0)


def _forward_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float() / temperature
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)
    return picked.tolist()


def _conversation(engine: HFEngine, encode: Any) -> list[Completion]:
    """Two turns: the second prompt is the first prompt + its sampled ids + an observation; plus a stranger."""
    first_prompt = encode("Question: who wrote the tiny model? <search> tiny model author </search>")
    first = engine.generate([GenerationRequest(prompt_ids=first_prompt, sampling=GREEDY)])[0][0]
    second_prompt = first_prompt + list(first.token_ids) + encode("<information> a passage </information>")
    stranger = encode("an unrelated prompt that shares nothing")
    sampled_twice = GREEDY.model_copy(update={"n": 2, "temperature": 0.7, "seed": 3})
    second, other = engine.generate(
        [
            GenerationRequest(prompt_ids=second_prompt, sampling=sampled_twice),
            GenerationRequest(prompt_ids=stranger, sampling=GREEDY),
        ]
    )
    return [first, *second, *other]


def test_next_turn_reuses_the_cache_and_decodes_as_without_it(sharp_model: Any, tok: Any, encode: Any) -> None:
    plain = HFEngine(sharp_model, tok)
    cached = HFEngine(sharp_model, tok, HFEngineConfig(prefix_cache_tokens=10_000))
    try:
        want = _conversation(plain, encode)
        got = _conversation(cached, encode)
    finally:
        plain.close()
        cached.close()
    first_prompt_len = len(want[0].prompt_ids)
    assert cached.decode_stats.reused_tokens == first_prompt_len + len(want[0].token_ids) - 1
    assert plain.decode_stats.reused_tokens == 0
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
    temperatures = [1.0, 0.7, 0.7, 1.0]  # greedy rows report the unscaled distribution's logprobs
    for g, temperature in zip(got, temperatures, strict=True):  # against a plain forward over the whole sequence
        reference = _forward_logprobs(sharp_model, g.prompt_ids, g.token_ids, temperature)
        assert g.logprobs == pytest.approx(reference, abs=1e-4)


def test_reusing_an_entry_never_writes_to_it(sharp_model: Any, tok: Any, encode: Any) -> None:
    engine = HFEngine(sharp_model, tok, HFEngineConfig(prefix_cache_tokens=10_000))
    try:
        prompt = encode("a prompt long enough to be cached by the engine")
        first = engine.generate([GenerationRequest(prompt_ids=prompt, sampling=GREEDY)])[0][0]
        assert engine.prefix_cache is not None
        (entry,) = engine.prefix_cache._entries.values()
        before = [(k.clone(), v.clone()) for k, v in entry.layers]
        longer = prompt + list(first.token_ids) + encode(" and more")
        for _ in range(2):  # one request alone (the stored tensors are used as views), then two together
            engine.generate([GenerationRequest(prompt_ids=longer, sampling=GREEDY)] * (1 + _))
        assert engine.decode_stats.reused_tokens >= 3 * (len(prompt) + len(first.token_ids) - 1)
        for (k, v), (k0, v0) in zip(entry.layers, before, strict=True):
            assert torch.equal(k, k0) and torch.equal(v, v0)
    finally:
        engine.close()


def test_changed_weights_empty_the_cache(sharp_model: Any, tok: Any, encode: Any) -> None:
    engine = HFEngine(sharp_model, tok, HFEngineConfig(prefix_cache_tokens=10_000))
    try:
        prompt = encode("a prompt long enough to be cached by the engine")
        engine.generate([GenerationRequest(prompt_ids=prompt, sampling=GREEDY)])
        assert engine.prefix_cache is not None and len(engine.prefix_cache) == 1
        with torch.no_grad():  # an optimizer step on a shared actor: in place, no update_weights call
            sharp_model.model.embed_tokens.weight.mul_(1.5)
        out = engine.generate([GenerationRequest(prompt_ids=prompt + encode(" more"), sampling=GREEDY)])[0][0]
        assert engine.decode_stats.reused_tokens == 0  # the stale entry was dropped before the lookup
        fresh = HFEngine(sharp_model, tok)
        expected = fresh.generate([GenerationRequest(prompt_ids=prompt + encode(" more"), sampling=GREEDY)])[0][0]
        fresh.close()
        assert out.token_ids == expected.token_ids

        engine.update_weights(dict(sharp_model.named_parameters()))
        assert len(engine.prefix_cache) == 0
    finally:
        engine.close()


def test_concurrent_conversations_hit_the_cache_through_agenerate(sharp_model: Any, tok: Any, encode: Any) -> None:
    async def converse(engine: HFEngine, topic: str) -> list[int]:
        prompt = encode(f"Question about {topic}: please search first.")
        for _ in range(3):
            out = (await engine.agenerate(GenerationRequest(prompt_ids=prompt, sampling=GREEDY)))[0]
            await asyncio.sleep(0.01)  # a tool call
            prompt = prompt + list(out.token_ids) + encode(f" <information> {topic} </information>")
        return prompt

    async def run(engine: HFEngine) -> list[list[int]]:
        return await asyncio.gather(*(converse(engine, t) for t in ("cats", "dogs", "a much longer topic here")))

    plain = HFEngine(sharp_model, tok)
    cached = HFEngine(sharp_model, tok, HFEngineConfig(prefix_cache_tokens=10_000))
    try:
        want = asyncio.run(run(plain))
        got = asyncio.run(run(cached))
    finally:
        plain.close()
        cached.close()
    assert got == want
    assert cached.decode_stats.reused_tokens > 0
    assert cached.decode_stats.prefill_tokens < plain.decode_stats.prefill_tokens


@pytest.fixture
def sharp_model(tok: Any) -> torch.nn.Module:
    """A tiny model whose numbers depend on every position: random small query/key weights give nearly uniform
    attention, blind to where the cached prefix sits, so they are scaled up (and the embeddings a little, so
    greedy choices are not near ties)."""
    m = tiny_qwen2(tok, seed=5)
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(4.0)
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    m.eval()
    return m
