"""`HFEngineConfig(inflight_kv="reprefill")`: after an in-flight weight update the paused rows' keys/values are
recomputed under the new weights, so every token sampled after the resume is the new policy's given its prefix.

The new weights are another model's altogether, so old-weight keys/values (what "keep" feeds on) differ from the new
ones everywhere. References are independent of the engine's cache machinery: a plain fp32 forward loop (no cache,
no padding) of the new model from prompt + the tokens sampled before the pause, and the new model's teacher-forced
log-softmax over the full sequence. A decode driven directly pauses at a chosen step: its `admit` source (polled
once per step) has a second thread pause the gate there, load the new weights and resume.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.engines import InflightWeightUpdate
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import move_from_start, tiny_qwen2
from rlloom.rollout.hf.decoding import DecodeSettings, DecodeStats, SampleRow, decode
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig
from rlloom.rollout.hf.pause import PauseGate


def sharp(tok: Any, seed: int, noise_seed: int) -> torch.nn.Module:
    """A tiny model moved far from its near-uniform start, so its greedy text varies (not one repeated token)
    and its choices are far from ties."""
    return move_from_start(tiny_qwen2(tok, seed=seed), seed=noise_seed)


@pytest.fixture
def old(tok: Any) -> torch.nn.Module:
    return sharp(tok, 0, 6)


@pytest.fixture
def new_state(tok: Any) -> dict[str, torch.Tensor]:
    """The weights pushed in flight: another sharp model's."""
    return dict(sharp(tok, 1, 8).state_dict())


def _loaded(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    m = copy.deepcopy(model)
    m.load_state_dict(state, strict=False)
    return m.eval()


@torch.no_grad()
def greedy_reference(model: torch.nn.Module, prefix: list[int], count: int) -> list[int]:
    """`count` greedy tokens after `prefix`, one full forward (no cache) per token."""
    seq = list(prefix)
    for _ in range(count):
        seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prefix) :]


@torch.no_grad()
def teacher_forced(
    model: torch.nn.Module, prompt: list[int], tokens: list[int], temperature: float = 1.0
) -> list[float]:
    """log p(token_t | prompt, tokens_<t) for every token, from one forward over the whole sequence."""
    logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def _row(index: int, prompt: list[int], sample: int = 0, **params: Any) -> SampleRow:
    sampling = SamplingParams(ignore_eos=True, logprobs=True, **params)
    return SampleRow(index, sample, list(prompt), sampling, frozenset())


class PushAt:
    """The `admit` source of a decode under test: hands over `joins[step]` at that step, and at `pause_step` has
    a trainer thread pause the gate, load `state` into the model and resume with `version`, so the decode parks
    at exactly that step's token boundary (tokens 0..pause_step come from the old weights)."""

    def __init__(
        self,
        model: torch.nn.Module,
        stats: DecodeStats,
        *,
        pause_step: int,
        state: dict[str, torch.Tensor],
        version: int = 1,
        joins: dict[int, list[SampleRow]] | None = None,
    ) -> None:
        self.model, self.stats, self.state, self.version = model, stats, state, version
        self.pause_step, self.joins = pause_step, dict(joins or {})
        self.gate = PauseGate()
        self.trainer: threading.Thread | None = None

    def __call__(self, room: int) -> list[SampleRow]:
        step = self.stats.steps
        if step == self.pause_step and self.trainer is None:
            self.trainer = threading.Thread(target=self._push)
            self.trainer.start()
            _wait_for(lambda: self.gate.paused)  # the checkpoint after this step's sample parks
        return self.joins.pop(step, [])

    def _push(self) -> None:
        self.gate.pause()
        with torch.no_grad():
            self.model.load_state_dict(self.state, strict=False)
        self.gate.resume(self.version)

    def run(self, rows: list[SampleRow], settings: DecodeSettings) -> None:
        with self.gate.decoding():
            decode(self.model, rows, settings, admit=self, stats=self.stats, gate=self.gate)
        assert self.trainer is not None, "the decode ended before the pause step"
        self.trainer.join(30)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.0005)


def _versions_split(row: SampleRow) -> int:
    """How many tokens came before the push (version 0); asserts the rest carry version 1."""
    k = row.policy_versions.count(0)
    assert row.policy_versions == [0] * k + [1] * (len(row.token_ids) - k)
    return k


PAUSE_STEP = 10


def _greedy_scenario(
    old: torch.nn.Module, new_state: dict[str, torch.Tensor], encode: Any, settings: DecodeSettings
) -> tuple[list[SampleRow], SampleRow, DecodeStats]:
    """Two rows of different prompt lengths from the start, a third joined before the pause (step 3), the push at
    step 10, a fourth joined after it (step 14); all greedy."""
    rows = [_row(0, encode("the weights change"), temperature=0.0, max_tokens=40)]
    rows.append(_row(1, encode("ab"), temperature=0.0, max_tokens=30))
    early = _row(2, encode("a longer prompt, joined early"), temperature=0.0, max_tokens=35)
    late = _row(3, encode("late"), temperature=0.0, max_tokens=20)
    stats = DecodeStats()
    push = PushAt(old, stats, pause_step=PAUSE_STEP, state=new_state, joins={3: [early], 14: [late]})
    push.run(rows, settings)
    return [*rows, early], late, stats


def test_tokens_after_a_reprefill_push_are_the_new_weights_greedy_continuation(
    old: torch.nn.Module, new_state: dict[str, torch.Tensor], tok: Any, encode: Any
) -> None:
    old_reference = copy.deepcopy(old)
    new_reference = _loaded(old, new_state)
    settings = DecodeSettings(pad_token_id=tok.pad_token_id, max_positions=1024, inflight_kv="reprefill")
    spanning, late, stats = _greedy_scenario(old, new_state, encode, settings)
    fed = 0
    for row in spanning:
        k = _versions_split(row)
        assert k == PAUSE_STEP + 1 - (3 if row.request_index == 2 else 0)  # tokens sampled up to the pause step
        fed += len(row.prompt_ids) + k - 1  # the last sampled token is fed after the resume, as usual
        before, after = row.token_ids[:k], row.token_ids[k:]
        assert len(set(before)) > 1 and len(set(after)) > 1  # real texts, not one token repeated
        assert before == greedy_reference(old_reference, row.prompt_ids, k)
        assert after == greedy_reference(new_reference, row.prompt_ids + before, len(after))
        assert row.logprobs[:k] == pytest.approx(teacher_forced(old_reference, row.prompt_ids, before), abs=1e-4)
        full = teacher_forced(new_reference, row.prompt_ids, row.token_ids)
        assert row.logprobs[k:] == pytest.approx(full[k:], abs=1e-4)
        assert not row.kv_stale  # its keys/values are the new weights' from the resume on
    assert late.policy_versions == [1] * 20
    assert late.token_ids == greedy_reference(new_reference, late.prompt_ids, 20)
    assert stats.reprefilled_tokens == fed


def test_keep_feeds_on_old_keys_and_values_so_its_tokens_differ(
    old: torch.nn.Module, new_state: dict[str, torch.Tensor], tok: Any, encode: Any
) -> None:
    """The same push with "keep" (the default): no recompute, the rows marked stale, and tokens after the resume
    that are not the new weights' continuation of the prefix (the choice matters)."""
    new_reference = _loaded(old, new_state)
    settings = DecodeSettings(pad_token_id=tok.pad_token_id, max_positions=1024)
    reprefilled, _, _ = _greedy_scenario(
        copy.deepcopy(old), new_state, encode, dataclasses.replace(settings, inflight_kv="reprefill")
    )
    kept, late, stats = _greedy_scenario(old, new_state, encode, settings)
    assert stats.reprefilled_tokens == 0 and all(row.kv_stale for row in kept)
    differs = 0
    for row, other in zip(kept, reprefilled, strict=True):
        k = _versions_split(row)
        assert row.token_ids[:k] == other.token_ids[:k]  # the same old-weight prefix
        exact = greedy_reference(new_reference, row.prompt_ids + row.token_ids[:k], len(row.token_ids) - k)
        differs += row.token_ids[k:] != exact and row.token_ids[k:] != other.token_ids[k:]
    assert differs == len(kept)
    assert late.token_ids == greedy_reference(new_reference, late.prompt_ids, 20)  # joined after: new weights only


def test_seeded_samples_keep_their_streams_across_a_reprefill(
    old: torch.nn.Module, new_state: dict[str, torch.Tensor], tok: Any, encode: Any
) -> None:
    """n = 3 seeded samples of one prompt (one prefill, three rows). Pushing the same weights changes nothing: the
    re-prefilled cache continues each sample's seeded stream exactly as without a pause. Pushing new weights, every
    logprob after the resume is the new model's at that temperature on the full sequence (the distribution each
    token was drawn from), and every one before it the old model's."""
    settings = DecodeSettings(pad_token_id=tok.pad_token_id, max_positions=1024, inflight_kv="reprefill")
    prompt = encode("seeded rows")

    def rows() -> list[SampleRow]:
        return [_row(0, prompt, s, temperature=0.9, seed=11, max_tokens=30) for s in range(3)]

    plain = rows()
    decode(copy.deepcopy(old), plain, settings)
    same = rows()
    PushAt(copy.deepcopy(old), DecodeStats(), pause_step=8, state=dict(old.state_dict())).run(same, settings)
    assert [r.token_ids for r in same] == [r.token_ids for r in plain]
    assert len({tuple(r.token_ids) for r in plain}) == 3  # three distinct samples
    for got, want in zip(same, plain, strict=True):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)

    old_reference, new_reference = copy.deepcopy(old), _loaded(old, new_state)
    pushed = rows()
    stats = DecodeStats()
    PushAt(old, stats, pause_step=8, state=new_state).run(pushed, settings)
    for row in pushed:
        k = _versions_split(row)
        assert k == 9
        assert row.logprobs[:k] == pytest.approx(
            teacher_forced(old_reference, prompt, row.token_ids[:k], 0.9), abs=1e-4
        )
        full = teacher_forced(new_reference, prompt, row.token_ids, 0.9)
        assert row.logprobs[k:] == pytest.approx(full[k:], abs=1e-4)
    assert stats.reprefilled_tokens == 3 * (len(prompt) + 8)


def test_a_multimodal_decode_refuses_reprefill_before_any_forward(model: torch.nn.Module, tok: Any) -> None:
    settings = DecodeSettings(
        pad_token_id=tok.pad_token_id, max_positions=1024, inflight_kv="reprefill", explicit_positions=False
    )
    row = _row(0, [5, 6, 7], temperature=0.0, max_tokens=3)
    with pytest.raises(ValueError, match=r"inflight_kv='reprefill' cannot re-prefill a multimodal decode"):
        decode(model, [row], settings, gate=PauseGate())
    assert row.token_ids == []


def test_a_vision_language_model_is_refused_at_construction(tok: Any) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
                       "fullatt_block_indexes": [0]},
        image_token_id=60, video_token_id=61, vision_start_token_id=62, vision_end_token_id=63,
    )  # fmt: skip
    vlm = Qwen2_5_VLForConditionalGeneration(config)
    with pytest.raises(ValueError, match=r"inflight_kv='reprefill' is not supported for .*use inflight_kv='keep'"):
        HFEngine(vlm, tok, HFEngineConfig(inflight_kv="reprefill"))
    HFEngine(vlm, tok).close()  # keep (the default) serves it


def test_the_engine_reprefills_a_paused_request_and_its_next_turn_reuses_those_keys(
    old: torch.nn.Module, new_state: dict[str, torch.Tensor], tok: Any, encode: Any
) -> None:
    """HFEngine end to end (the pause falls wherever the trainer's thread catches the decode): keeps_kv_cache is
    False, the tokens after the resume are the new weights' greedy continuation, the re-prefill is counted, and
    the finished row's keys/values (the new weights') seed the prefix cache for the next turn."""
    new_reference = _loaded(old, new_state)
    engine = HFEngine(old, tok, HFEngineConfig(gather_s=0.0, inflight_kv="reprefill", prefix_cache_tokens=10_000))
    assert isinstance(engine, InflightWeightUpdate) and not engine.keeps_kv_cache
    default = HFEngine(old, tok)
    assert default.keeps_kv_cache  # "keep" is the default
    default.close()
    prompt = encode("the weights change")

    def greedy(prompt_ids: list[int], max_tokens: int) -> GenerationRequest:
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=True)
        return GenerationRequest(prompt_ids=prompt_ids, sampling=sampling)

    request = greedy(prompt, 200)
    done: list[Completion] = []
    try:
        thread = threading.Thread(target=lambda: done.extend(asyncio.run(engine.agenerate(request))))
        thread.start()
        _wait_for(lambda: engine.decode_stats.steps >= 5)
        engine.pause_generation()
        engine.update_weights(new_state)
        engine.resume_generation(1)
        thread.join(60)
        [completion] = done
        k = completion.policy_versions.count(0) if completion.policy_versions else -1
        assert 5 <= k < 200 and completion.policy_versions == [0] * k + [1] * (200 - k)
        assert engine.decode_stats.reprefilled_tokens == len(prompt) + k - 1
        next_turn = prompt + completion.token_ids + encode(" next")
        reused = engine.decode_stats.reused_tokens
        [[answer]] = engine.generate([greedy(next_turn, 4)])
        assert engine.decode_stats.reused_tokens - reused == len(prompt) + 199  # all it fed, the last token aside
    finally:
        engine.close()
    after = completion.token_ids[k:]
    assert after == greedy_reference(new_reference, prompt + completion.token_ids[:k], len(after))
    assert completion.logprobs is not None
    full = teacher_forced(new_reference, prompt, completion.token_ids)
    assert completion.logprobs[k:] == pytest.approx(full[k:], abs=1e-4)
    assert answer.token_ids == greedy_reference(new_reference, next_turn, 4)


def test_a_pause_that_changes_no_weight_reprefills_nothing(
    old: torch.nn.Module, new_state: dict[str, torch.Tensor], tok: Any, encode: Any
) -> None:
    """reprefill recomputes keys/values only when the weights moved while parked: a pause and a resume at the same
    version without an update costs nothing and leaves the tokens the unpaused greedy ones; an update that keeps
    the version label (its parameters were written) still re-prefills."""
    engine = HFEngine(old, tok, HFEngineConfig(gather_s=0.0, inflight_kv="reprefill"))
    request = GenerationRequest(
        prompt_ids=encode("nothing changes"), sampling=SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    )

    def paused_once(update: dict[str, torch.Tensor] | None) -> Completion:
        done: list[Completion] = []
        thread = threading.Thread(target=lambda: done.extend(asyncio.run(engine.agenerate(request))))
        steps = engine.decode_stats.steps
        thread.start()
        _wait_for(lambda: engine.decode_stats.steps >= steps + 5)
        engine.pause_generation()
        if update is not None:
            engine.update_weights(update)
        engine.resume_generation(0)  # the same label either way
        thread.join(60)
        return done[0]

    try:
        [[unpaused]] = engine.generate([request])
        assert paused_once(None).token_ids == unpaused.token_ids
        assert engine.decode_stats.reprefilled_tokens == 0
        paused_once(new_state)
        assert engine.decode_stats.reprefilled_tokens > len(request.prompt_ids or [])
    finally:
        engine.close()
