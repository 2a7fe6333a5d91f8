"""HFEngine against independent references: a plain forward pass, `model.generate`, hand-built prompts."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.protocols import RolloutEngine
from rlloom.core_rl.observe import progress
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine
from rlloom.rollout.hf.kv_cache import cache_keyword


def _req(prompt: list[int], **sampling: Any) -> GenerationRequest:
    return GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(**sampling))


def test_engine_satisfies_the_protocol(engine: HFEngine) -> None:
    assert isinstance(engine, RolloutEngine)


def test_greedy_matches_model_generate(engine: HFEngine, model: Any, tok: Any, encode: Any) -> None:
    prompts = [encode("Hello there"), encode("abc")]
    out = engine.generate([_req(p, temperature=0.0, max_tokens=24, ignore_eos=True) for p in prompts])
    padded = tok.pad({"input_ids": prompts}, return_tensors="pt")
    ref = model.generate(**padded, do_sample=False, max_new_tokens=24, min_new_tokens=24, pad_token_id=tok.pad_token_id)
    width = padded["input_ids"].shape[1]
    for i in range(2):
        assert out[i][0].token_ids == ref[i, width:].tolist()
        assert out[i][0].finish_reason == "length"


def test_seed_makes_sampling_reproducible(engine: HFEngine, encode: Any) -> None:
    p = encode("The quick brown fox")
    a = engine.generate([_req(p, seed=7, max_tokens=32, ignore_eos=True)])[0][0]
    # same seed in a different batch (other prompt lengths, other requests before it): same tokens
    b = engine.generate([_req(encode("x"), max_tokens=8), _req(p, seed=7, max_tokens=32, ignore_eos=True)])[1][0]
    c = engine.generate([_req(p, seed=8, max_tokens=32, ignore_eos=True)])[0][0]
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_n_samples_are_distinct_and_indexed(engine: HFEngine, encode: Any) -> None:
    p = encode("group")
    out = engine.generate([_req(p, n=4, seed=3, max_tokens=16, ignore_eos=True)])
    assert len(out) == 1 and len(out[0]) == 4
    assert [c.sample_index for c in out[0]] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in out[0]}) == 4
    assert all(c.prompt_ids == p and len(c.token_ids) == 16 for c in out[0])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_plain_forward_pass(engine: HFEngine, model: Any, encode: Any, temperature: float) -> None:
    prompts = [encode("short"), encode("a much longer prompt here")]  # left padding in the batch
    out = engine.generate([_req(p, temperature=temperature, max_tokens=20, seed=i) for i, p in enumerate(prompts)])
    for p, [c] in zip(prompts, out, strict=True):
        full = torch.tensor([p + c.token_ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(p) - 1 : -1].float() / temperature
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids).unsqueeze(-1)).squeeze(-1)
        assert c.logprobs is not None
        assert torch.max(torch.abs(ref - torch.tensor(c.logprobs))).item() < 1e-4


def test_truncation_knobs_that_leave_one_token_are_greedy(engine: HFEngine, encode: Any) -> None:
    p = encode("knobs")
    greedy = engine.generate([_req(p, temperature=0.0, max_tokens=12, ignore_eos=True)])[0][0].token_ids
    for knob in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        got = engine.generate([_req(p, temperature=1.5, max_tokens=12, ignore_eos=True, **knob)])[0][0]
        assert got.token_ids == greedy, knob


def test_stop_string_cuts_text_and_keeps_minimal_tokens(engine: HFEngine, tok: Any, encode: Any) -> None:
    p = encode("stop here")
    full = engine.generate([_req(p, seed=11, max_tokens=40, ignore_eos=True)])[0][0]
    stop = full.text[10:12]
    at = full.text.find(stop)
    out = engine.generate(
        [
            _req(p, seed=11, max_tokens=40, ignore_eos=True, stop=[stop]),
            _req(p, seed=11, max_tokens=40, ignore_eos=True, stop=[stop], include_stop_str_in_output=False),
        ]
    )
    kept, dropped = out[0][0], out[1][0]
    assert kept.text == full.text[: at + len(stop)]
    assert dropped.text == full.text[:at]
    assert kept.finish_reason == "stop" and kept.stop_reason == stop
    assert kept.token_ids == full.token_ids[: len(kept.token_ids)]
    assert stop in tok.decode(kept.token_ids) and stop not in tok.decode(kept.token_ids[:-1])
    assert dropped.token_ids == kept.token_ids  # only the text differs


def test_stop_token_id_ends_generation(engine: HFEngine, encode: Any) -> None:
    p = encode("ids")
    full = engine.generate([_req(p, seed=11, max_tokens=30, ignore_eos=True)])[0][0]
    target = full.token_ids[5]
    first = full.token_ids.index(target)
    got = engine.generate([_req(p, seed=11, max_tokens=30, ignore_eos=True, stop_token_ids=[target])])[0][0]
    assert got.token_ids == full.token_ids[: first + 1]
    assert got.finish_reason == "stop" and got.stop_reason == target
    # its text (one character here) follows include_stop_str_in_output, as in vLLM; the ids keep the token
    assert got.text == full.text[: first + 1]
    dropped = engine.generate(
        [_req(p, seed=11, max_tokens=30, ignore_eos=True, stop_token_ids=[target], include_stop_str_in_output=False)]
    )[0][0]
    assert dropped.token_ids == got.token_ids and dropped.text == full.text[:first]


def test_an_eos_stop_has_no_stop_reason_as_in_vllm(
    model: Any, tok: Any, encode: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM: stop_reason is the stop string or stop_token_ids entry that ended a sample, None for the EOS."""
    p = encode("eos")
    plain = HFEngine(model, tok)
    full = plain.generate([_req(p, seed=11, max_tokens=30, ignore_eos=True)])[0][0]
    plain.close()
    target = full.token_ids[5]
    first = full.token_ids.index(target)
    # the model's generation config names `target` as a second EOS (as Qwen instruct configs list two)
    monkeypatch.setattr(model.generation_config, "eos_token_id", [tok.eos_token_id, target])
    engine = HFEngine(model, tok)
    got = engine.generate([_req(p, seed=11, max_tokens=30)])[0][0]
    asked = engine.generate([_req(p, seed=11, max_tokens=30, stop_token_ids=[target])])[0][0]
    engine.close()
    assert got.token_ids == full.token_ids[: first + 1] and got.finish_reason == "stop"
    assert got.stop_reason is None
    assert asked.token_ids == got.token_ids and asked.stop_reason == target


def test_chat_messages_render_with_the_template(engine: HFEngine, encode: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    req = GenerationRequest(messages=messages, sampling=SamplingParams(temperature=0.0, max_tokens=5))
    expected = encode(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert engine.prompt_ids(req) == expected
    assert engine.generate([req])[0][0].prompt_ids == expected


def test_weight_update_changes_outputs(engine: HFEngine, tok: Any, encode: Any, peaked_state: Any) -> None:
    p = encode("weights")
    before = engine.generate([_req(p, seed=11, max_tokens=20, ignore_eos=True)])[0][0]
    other = tiny_qwen2(tok, seed=123)
    other.load_state_dict(peaked_state(tok, seed=123), strict=False)
    engine.update_weights(dict(other.state_dict()))
    after = engine.generate([_req(p, seed=11, max_tokens=20, ignore_eos=True)])[0][0]
    reference = HFEngine(other, tok).generate([_req(p, seed=11, max_tokens=20, ignore_eos=True)])[0][0]
    assert after.token_ids != before.token_ids
    assert after.token_ids == reference.token_ids
    assert after.logprobs == pytest.approx(reference.logprobs, abs=1e-5)


def test_weight_update_rejects_bad_names_and_shapes(engine: HFEngine) -> None:
    with pytest.raises(KeyError, match=r"model\.nope"):
        engine.update_weights({"model.nope": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)})


def test_shared_module_sees_actor_updates_without_sync(engine: HFEngine, model: Any, encode: Any) -> None:
    p = encode("shared")
    before = engine.generate([_req(p, seed=11, max_tokens=16, ignore_eos=True)])[0][0]
    with torch.no_grad():  # an optimizer step on the actor, which *is* the engine's model
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
        model.model.embed_tokens.weight.mul_(40.0)
    engine.update_weights(dict(model.state_dict()))  # same tensors: a no-op
    model.train()  # the trainer left the actor in train mode
    after = engine.generate([_req(p, seed=11, max_tokens=16, ignore_eos=True)])[0][0]
    assert after.token_ids != before.token_ids
    assert model.training  # sampled in eval mode, handed back as it was


def test_agenerate_batches_concurrent_callers(engine: HFEngine, encode: Any) -> None:
    prompts = [encode(f"conversation {i}") for i in range(16)]
    reqs = [_req(p, seed=i, max_tokens=12, ignore_eos=True) for i, p in enumerate(prompts)]

    async def run_all() -> list[Any]:
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    got = asyncio.run(run_all())
    assert engine.batches_run <= 3  # 16 callers, not 16 batches
    alone = engine.generate(reqs)
    assert [g[0].token_ids for g in got] == [a[0].token_ids for a in alone]


def test_a_rollout_reports_samples_and_tokens_to_the_progress_line(engine: HFEngine, encode: Any) -> None:
    """As vLLM's engines do: every finished request's samples (of the batch's) and tokens, a line at most every
    `every_s` (0 here: a line per report); 3 requests x 2 samples x 5 tokens (EOS ignored) = 6 samples, 30 tokens."""
    written: list[str] = []
    reqs = [_req(encode(f"row {i}"), n=2, seed=i, max_tokens=5, ignore_eos=True) for i in range(3)]
    with progress.phase("rollout", every_s=0.0, write=written.append):
        engine.generate(reqs)
    assert [line.split(" tokens")[0] for line in written] == [
        "[rollout] 2/6 samples, 10",
        "[rollout] 4/6 samples, 20",
        "[rollout] 6/6 samples, 30",
    ], written


def test_agent_turns_report_to_the_progress_line(engine: HFEngine, encode: Any) -> None:
    """`agenerate` callers (agent turns) count as turns, as in vLLM's async engine: 4 turns x 3 tokens."""
    written: list[str] = []

    async def run_all() -> list[Any]:
        reqs = [_req(encode(f"turn {i}"), seed=i, max_tokens=3, ignore_eos=True) for i in range(4)]
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    with progress.phase("rollout", every_s=0.0, write=written.append):
        asyncio.run(run_all())
    assert len(written) == 4 and written[-1].startswith("[rollout] 4 turns, 12 tokens ("), written


def test_a_bad_concurrent_request_fails_only_its_caller(tok: Any, encode: Any) -> None:
    engine = HFEngine(tiny_qwen2(tok, max_position_embeddings=32), tok)
    good = [_req(encode(f"ok {i}"), max_tokens=4) for i in range(3)]
    bad = _req(list(range(10, 50)), max_tokens=4)

    async def run() -> list[Any]:
        return await asyncio.gather(*(engine.agenerate(r) for r in [*good, bad]), return_exceptions=True)

    out = asyncio.run(run())
    engine.close()
    assert all(isinstance(o, list) and len(o) == 1 for o in out[:3])
    assert isinstance(out[3], ValueError) and "context" in str(out[3])


def test_prompt_longer_than_context_is_rejected(tok: Any) -> None:
    small = tiny_qwen2(tok, max_position_embeddings=8)
    with pytest.raises(ValueError, match="context"):
        HFEngine(small, tok).generate([_req(list(range(10, 20)))])


def test_context_limit_ends_with_length(tok: Any) -> None:
    small = tiny_qwen2(tok, max_position_embeddings=16)
    [c] = HFEngine(small, tok).generate([_req(list(range(10, 20)), max_tokens=50, ignore_eos=True)])[0:1][0]
    assert c.finish_reason == "length" and len(c.token_ids) == 6
    assert HFEngine(small, tok).context_window == 16  # what callers (the agent loop) may plan with


def _openmp_threads_reader() -> Any:
    """`omp_get_max_threads` of the OpenMP runtime torch uses (per-thread state), or None if not found."""
    import ctypes
    from pathlib import Path

    libs = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    return ctypes.CDLL(str(libs[0])).omp_get_max_threads if libs else None


def test_worker_thread_uses_the_process_thread_setting(engine: HFEngine, encode: Any) -> None:
    # torch keeps set_num_threads in OpenMP's per-thread state: a thread started later would otherwise run ops
    # on every core whatever the caller asked for.
    read = _openmp_threads_reader()
    if read is None:
        pytest.skip("torch is not built against libgomp here")
    seen: list[int] = []
    forward = engine.model.forward

    def recording_forward(*args: Any, **kwargs: Any) -> Any:
        seen.append(read())
        return forward(*args, **kwargs)

    engine.model.forward = recording_forward  # type: ignore[method-assign]
    try:
        asyncio.run(engine.agenerate(_req(encode("threads"), max_tokens=3)))
    finally:
        del engine.model.forward
    assert torch.get_num_threads() == 1  # the autouse fixture's setting
    assert seen and set(seen) == {1}


def test_generation_passes_the_cache_under_the_name_the_model_declares(engine: HFEngine, encode: Any) -> None:
    import warnings

    class OldStyle(torch.nn.Module):
        def forward(self, input_ids: Any = None, past_key_values: Any = None) -> None: ...

    assert cache_keyword(OldStyle()) == "past_key_values"
    assert cache_keyword(engine.model) in inspect.signature(type(engine.model).forward).parameters
    request = GenerationRequest(prompt_ids=encode("abc"), sampling=SamplingParams(max_tokens=6, seed=1))
    with warnings.catch_warnings(record=True) as caught:  # the filters are process-wide: the decode thread's too
        warnings.simplefilter("always")
        [[completion]] = engine.generate([request])
    assert completion.token_ids
    assert not [w for w in caught if "past_key_values" in str(w.message)]


def test_a_checkpoint_folder_loads_its_own_tokenizer_as_saved(tmp_path: Any, tok: Any, model: Any) -> None:
    """A trainer checkpoint keeps the tiny char tokenizer beside the Qwen2 config; both loaders must keep it."""
    from rlloom.rollout.policy_spec import PolicySpec, build_engine

    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    text = "reverse 482\nanswer: 284"
    expected = tok(text, add_special_tokens=False)["input_ids"]
    loaded = HFEngine.from_pretrained(tmp_path, device="cpu")
    spec_engine, spec_tokenizer = build_engine(PolicySpec(model=tmp_path, device="cpu"))
    try:
        for tokenizer in (loaded.tokenizer, spec_tokenizer):
            assert tokenizer(text, add_special_tokens=False)["input_ids"] == expected
    finally:
        loaded.close()
        spec_engine.close()
