"""VLLMEngine: the pure translation to vLLM's arguments runs everywhere; the engine itself needs vLLM + CUDA.

vLLM cannot be installed on this project's machines, so the `vllm`-marked tests are skipped here and the
adapter is unverified (see the package README).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from rlloom.core_rl.generation import GenerationRequest, SamplingParams
from rlloom.rollout.vllm_engine import VLLMEngineConfig, vllm_sampling_kwargs, weight_buckets

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
    reason="needs vLLM (extra `vllm`, CUDA build) and a GPU; not installable on this project's machines",
)


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


def test_engine_without_vllm_explains_the_install() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    from rlloom.rollout.vllm_engine import VLLMEngine

    with pytest.raises(ImportError, match=r"rlloom-rollout\[vllm\]"):
        VLLMEngine(VLLMEngineConfig(model="unused"))


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory: Any) -> Any:
    from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
    from rlloom.rollout.vllm_engine import VLLMEngine

    folder = tmp_path_factory.mktemp("tiny")
    tok = char_tokenizer()
    tiny_qwen2(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    engine = VLLMEngine(VLLMEngineConfig(model=str(folder), gpu_memory_utilization=0.2, enforce_eager=True))
    yield engine
    engine.close()


@pytest.mark.vllm
@needs_vllm
def test_vllm_stop_strings_logprobs_and_weight_update(vllm_engine: Any) -> None:
    from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2

    tok = char_tokenizer()
    prompt = list(tok("hello", add_special_tokens=False)["input_ids"])
    req = GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(n=2, seed=1, max_tokens=16, ignore_eos=True))
    [before] = vllm_engine.generate([req])
    assert len(before) == 2 and all(len(c.token_ids) == 16 and len(c.logprobs) == 16 for c in before)
    other = tiny_qwen2(tok, seed=5)
    with torch.no_grad():
        other.model.embed_tokens.weight.mul_(40.0)
    vllm_engine.update_weights(dict(other.state_dict()))
    [after] = vllm_engine.generate([req])
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


@pytest.mark.vllm
@needs_vllm
def test_vllm_sleep_and_wake(vllm_engine: Any) -> None:
    req = GenerationRequest(prompt_ids=[10, 11, 12], sampling=SamplingParams(temperature=0.0, max_tokens=8))
    first = vllm_engine.generate([req])[0][0].token_ids
    vllm_engine.sleep(level=1)
    with pytest.raises(RuntimeError, match="asleep"):
        vllm_engine.generate([req])
    vllm_engine.wake_up()
    assert vllm_engine.generate([req])[0][0].token_ids == first
