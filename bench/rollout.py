"""Rollout throughput: HFEngine against calling `model.generate` directly on the same batch.

Both sides sample the same batch (same prompts, temperature 1, a fixed number of new tokens: the engine with
`ignore_eos`, `generate` with `min_new_tokens`), in alternating order, `--repeats` times; we print median
tokens/s and the ratio engine / generate. The engine does its full job (per-token logprobs, per-request
bookkeeping, text decoding); `generate` returns bare token ids. A second table shows `agenerate` under 64
concurrent callers (an agent's conversations) against awaiting the same requests one at a time.

    python bench/rollout.py                 # CPU: tiny model and a ~25M-parameter model, two batch sizes
    python bench/rollout.py --gpu           # CUDA: a Qwen2.5-0.5B-sized model from config, bf16, SDPA,
                                            #       batch 64, 256 new tokens
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig


@dataclass
class Case:
    name: str
    model: Any
    tokenizer: Any
    batch: int
    prompt_len: int
    new_tokens: int


def numbered_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with `vocab_size` entries, so a full-vocabulary model can decode its samples."""
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i} ": i for i in range(2, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    tok.padding_side = "left"
    return tok


def qwen2_from_config(vocab: int, *, hidden: int, layers: int, heads: int, kv: int, inter: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def prompts_for(case: Case) -> list[list[int]]:
    """Prompts of varied length (so left padding is exercised), ids drawn from the ordinary vocabulary."""
    g = torch.Generator().manual_seed(1)
    low = len(case.tokenizer.all_special_ids) + 1
    vocab = case.model.config.vocab_size
    lengths = [max(4, case.prompt_len - (i % 4) * (case.prompt_len // 8)) for i in range(case.batch)]
    return [torch.randint(low, vocab, (n,), generator=g).tolist() for n in lengths]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_generate(case: Case, prompts: list[list[int]], device: torch.device) -> float:
    padded = case.tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(device)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = case.model.generate(
            **padded,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=case.new_tokens,
            min_new_tokens=case.new_tokens,
            pad_token_id=case.tokenizer.pad_token_id,
        )
    sync(device)
    elapsed = time.perf_counter() - t0
    new = (out.shape[1] - padded["input_ids"].shape[1]) * out.shape[0]
    return new / elapsed


def time_engine(engine: HFEngine, case: Case, prompts: list[list[int]], device: torch.device) -> float:
    params = SamplingParams(temperature=1.0, max_tokens=case.new_tokens, ignore_eos=True)
    requests = [GenerationRequest(prompt_ids=p, sampling=params) for p in prompts]
    sync(device)
    t0 = time.perf_counter()
    out = engine.generate(requests)
    sync(device)
    elapsed = time.perf_counter() - t0
    return sum(len(c[0].token_ids) for c in out) / elapsed


def run_case(case: Case, repeats: int, device: torch.device) -> dict[str, float]:
    engine = HFEngine(case.model, case.tokenizer, HFEngineConfig(max_batch_rows=max(64, case.batch)))
    prompts = prompts_for(case)
    time_generate(case, prompts, device)  # warm-up both paths (allocator, kernels)
    time_engine(engine, case, prompts, device)
    gen, eng = [], []
    for r in range(repeats):
        order = [0, 1] if r % 2 == 0 else [1, 0]
        for which in order:
            if which == 0:
                gen.append(time_generate(case, prompts, device))
            else:
                eng.append(time_engine(engine, case, prompts, device))
    engine.close()
    g, e = statistics.median(gen), statistics.median(eng)
    return {"generate": g, "engine": e, "ratio": e / g}


def concurrent_callers(case: Case, callers: int, device: torch.device) -> dict[str, float]:
    """tokens/s of `callers` concurrent `agenerate` calls vs the same calls awaited one after another."""
    engine = HFEngine(case.model, case.tokenizer, HFEngineConfig(max_batch_rows=callers))
    params = SamplingParams(temperature=1.0, max_tokens=case.new_tokens, ignore_eos=True)
    g = torch.Generator().manual_seed(2)
    low = len(case.tokenizer.all_special_ids) + 1
    requests = [
        GenerationRequest(
            prompt_ids=torch.randint(low, case.model.config.vocab_size, (case.prompt_len,), generator=g).tolist(),
            sampling=params,
        )
        for _ in range(callers)
    ]

    async def together() -> None:
        await asyncio.gather(*(engine.agenerate(r) for r in requests))

    async def one_by_one() -> None:
        for r in requests:
            await engine.agenerate(r)

    tokens = callers * case.new_tokens
    timings = {}
    for name, fn in (("sequential", one_by_one), ("concurrent", together)):
        sync(device)
        t0 = time.perf_counter()
        batches = engine.batches_run
        asyncio.run(fn())
        sync(device)
        timings[name] = tokens / (time.perf_counter() - t0)
        timings[f"{name}_batches"] = engine.batches_run - batches
    engine.close()
    return timings


def cpu_cases() -> list[Case]:
    tok = char_tokenizer()
    tiny = tiny_qwen2(tok).eval()
    mid = qwen2_from_config(len(tok), hidden=512, layers=8, heads=8, kv=2, inter=1408).eval()
    mid.generation_config.pad_token_id = tok.pad_token_id
    return [
        Case("tiny (0.1M)", tiny, tok, 8, 32, 64),
        Case("tiny (0.1M)", tiny, tok, 32, 32, 64),
        Case("qwen2 25M", mid, tok, 8, 64, 64),
        Case("qwen2 25M", mid, tok, 32, 64, 64),
    ]


def gpu_cases() -> list[Case]:
    """Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14/2 heads, 151,936 vocab), random weights, bf16, SDPA."""
    tok = numbered_tokenizer(151936)
    model = qwen2_from_config(151936, hidden=896, layers=24, heads=14, kv=2, inter=4864)
    model.config._attn_implementation = "sdpa"
    torch.nn.Module.to(model, device="cuda", dtype=torch.bfloat16)
    model.eval()
    return [Case("qwen2.5-0.5B-sized bf16", model, tok, 64, 256, 256)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="the CUDA case (Qwen2.5-0.5B-sized, bf16, batch 64)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--only", default="", help="run only cases whose model name contains this (e.g. 25M)")
    parser.add_argument("--no-callers", action="store_true", help="skip the concurrent-callers table")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu needs a CUDA device; run without --gpu for the CPU cases")
    device = torch.device("cuda" if args.gpu else "cpu")
    cases = [c for c in (gpu_cases() if args.gpu else cpu_cases()) if args.only in c.name]
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} repeats={args.repeats}")
    print("| model | batch | prompt | new tokens | generate tok/s | HFEngine tok/s | engine / generate |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        res = run_case(case, args.repeats, device)
        print(
            f"| {case.name} | {case.batch} | {case.prompt_len} | {case.new_tokens} | {res['generate']:.0f} | "
            f"{res['engine']:.0f} | {res['ratio']:.2f} |",
            flush=True,
        )
    if args.no_callers or not cases:
        return
    case = cases[0]
    res = concurrent_callers(case, 64, device)
    print()
    print("| model | callers | sequential tok/s (batches) | concurrent tok/s (batches) | concurrent / sequential |")
    print("|---|---|---|---|---|")
    print(
        f"| {case.name} | 64 | {res['sequential']:.0f} ({res['sequential_batches']:.0f}) | "
        f"{res['concurrent']:.0f} ({res['concurrent_batches']:.0f}) | {res['concurrent'] / res['sequential']:.1f} |"
    )


if __name__ == "__main__":
    main()
