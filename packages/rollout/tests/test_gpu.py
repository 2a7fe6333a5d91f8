"""HFEngine on CUDA in bf16 with SDPA attention (run with `pytest -m gpu` on a machine with a GPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def cuda_model(tok: Any) -> Any:
    model = tiny_qwen2(tok, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=512)
    model.config._attn_implementation = "sdpa"
    torch.nn.Module.to(model, device="cuda", dtype=torch.bfloat16)
    return model.eval()


def test_bf16_logprobs_match_forward_pass(cuda_model: Any, tok: Any, encode: Any) -> None:
    engine = HFEngine(cuda_model, tok)
    prompts = [encode("short"), encode("a longer prompt with padding")]
    out = engine.generate(
        [GenerationRequest(prompt_ids=p, sampling=SamplingParams(seed=i, max_tokens=32)) for i, p in enumerate(prompts)]
    )
    for p, [c] in zip(prompts, out, strict=True):
        ids = torch.tensor([p + c.token_ids], device="cuda")
        with torch.no_grad():
            logits = cuda_model(ids).logits[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids, device="cuda")[:, None])[:, 0]
        # bf16 with a different batch shape: kernels differ, so only approximately equal
        assert torch.max(torch.abs(ref.cpu() - torch.tensor(c.logprobs))).item() < 0.05
    engine.close()


def test_bf16_greedy_agrees_with_generate(cuda_model: Any, tok: Any, encode: Any) -> None:
    engine = HFEngine(cuda_model, tok)
    p = encode("greedy on the gpu")
    got = engine.generate(
        [GenerationRequest(prompt_ids=p, sampling=SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))]
    )[0][0]
    ref = cuda_model.generate(torch.tensor([p], device="cuda"), do_sample=False, max_new_tokens=16, min_new_tokens=16)
    # bf16 ties can flip late tokens; the first few must agree
    assert got.token_ids[:4] == ref[0, len(p) : len(p) + 4].tolist()
    engine.close()


def test_batch_of_64_with_seeds_is_reproducible(cuda_model: Any, tok: Any, encode: Any) -> None:
    engine = HFEngine(cuda_model, tok)
    reqs = [
        GenerationRequest(prompt_ids=encode(f"row {i}"), sampling=SamplingParams(seed=i, max_tokens=64))
        for i in range(64)
    ]
    a = engine.generate(reqs)
    b = engine.generate(reqs)
    assert [x[0].token_ids for x in a] == [y[0].token_ids for y in b]
    engine.close()
