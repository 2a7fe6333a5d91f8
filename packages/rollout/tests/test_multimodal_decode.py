"""The decode loop's multimodal knobs: banned tokens and explicit M-RoPE prompt positions."""

import dataclasses
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.rollout.hf.decoding import DecodeSettings, SampleRow, decode
from rlloom.rollout.hf.engine import HFEngine


def _row(prompt: list[int], **params: Any) -> SampleRow:
    return SampleRow(0, 0, list(prompt), SamplingParams(ignore_eos=True, **params), frozenset())


def _full_vocab_logprobs(model: torch.nn.Module, row: SampleRow, temperature: float) -> torch.Tensor:
    ids = torch.tensor([row.prompt_ids + row.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(row.prompt_ids) - 1 : -1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(row.token_ids)[:, None])[:, 0]


def test_banned_tokens_are_never_sampled_and_logprobs_stay_full_vocabulary(
    model: torch.nn.Module, tok: Any, encode: Any
) -> None:
    settings = DecodeSettings(pad_token_id=tok.pad_token_id, max_positions=1024)
    prompt = encode("ban me")
    free = _row(prompt, temperature=0.0, max_tokens=6)
    decode(model, [free], settings)
    banned = tuple(sorted(set(free.token_ids)))  # everything greedy decoding picked on its own
    greedy = _row(prompt, temperature=0.0, max_tokens=6)
    decode(model, [greedy], dataclasses.replace(settings, banned_token_ids=banned))
    assert not set(greedy.token_ids) & set(banned)
    torch.testing.assert_close(torch.tensor(greedy.logprobs), _full_vocab_logprobs(model, greedy, 1.0))

    hot = [_row(prompt, temperature=0.8, seed=s, max_tokens=24) for s in range(4)]
    decode(model, hot, dataclasses.replace(settings, banned_token_ids=banned))
    for row in hot:
        assert not set(row.token_ids) & set(banned)
        torch.testing.assert_close(torch.tensor(row.logprobs), _full_vocab_logprobs(model, row, 0.8))


def test_text_requests_are_not_banned_anything(engine: HFEngine) -> None:
    assert engine._vision_token_ids == ()  # a text-only model's config names no vision tokens


def test_rope_positions_of_the_wrong_length_are_rejected(engine: HFEngine, encode: Any) -> None:
    prompt = encode("abc")
    request = GenerationRequest(
        prompt_ids=prompt,
        multimodal={"position_ids": torch.zeros(3, len(prompt) + 2, dtype=torch.long)},
        sampling=SamplingParams(max_tokens=2),
    )
    with pytest.raises(ValueError, match=r"M-RoPE positions cover 5 tokens but the prefill is \(1, 3\)"):
        engine.generate([request])
