"""vLLM on CPU in float32 against bfloat16: generation tokens/s and engine start, SmolLM2-135M-Instruct, eager.

vLLM's dtype "auto" runs a float32 checkpoint in bfloat16 on CPU. That pays where the CPU multiplies bf16 natively
(AVX512-BF16 or AMX on x86, the BF16 extension on Arm: oneDNN's bf16 kernels); on an AVX2-only CPU vLLM logs
"Failed to create oneDNN linear, fallback to torch linear" and decodes in emulated bf16. The engines' own "auto"
(`rlloom.rollout.vllm.cpu_dtype`) picks float32 there; this measures what that choice is worth on the machine it
runs on, and prints which one the engines would pick.

Each start runs in a fresh process, alternating float32 and bfloat16 `--repeats` times; both get the same
explicit KV cache, the same 32 distinct random prompts x 64 new tokens (temperature 1, ignore_eos), timed after
one warm-up batch. Medians and the ratio float32 / bfloat16 of this run.

    python bench/vllm_cpu_dtype.py --model models/smollm2-135m-instruct [--repeats 2]
    (in the bench-vllm venv: python3 -m nox -s bench-vllm -R -- vllm_cpu_dtype --model ...)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROWS, PROMPT_LEN, NEW_TOKENS = 32, 32, 64
DTYPES = ("float32", "bfloat16")


def child(model: Path, dtype: str, kv_gib: float) -> dict[str, float]:
    import torch

    from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
    from rlloom.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

    started = time.perf_counter()
    engine = VLLMEngine(
        VLLMEngineConfig(
            model=str(model),
            dtype=dtype,
            enforce_eager=True,
            max_model_len=PROMPT_LEN + NEW_TOKENS + 8,
            max_batch_rows=ROWS,
            kv_cache_memory_bytes=int(kv_gib * (1 << 30)),
        )
    )
    start_s = time.perf_counter() - started
    gen = torch.Generator().manual_seed(0)
    vocab = len(engine.tokenizer)
    params = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, ignore_eos=True, seed=0)
    requests = [
        GenerationRequest(prompt_ids=torch.randint(100, vocab, (PROMPT_LEN,), generator=gen).tolist(), sampling=params)
        for _ in range(ROWS)
    ]
    engine.generate(requests[:8])  # warm-up
    started = time.perf_counter()
    out = engine.generate(requests)
    tokens = sum(len(r[0].token_ids) for r in out) / (time.perf_counter() - started)
    engine.close()
    return {"start_s": start_s, "tokens_per_s": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--child", choices=DTYPES, default=None)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/vllm_cpu_dtype"), help="each start's stderr")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.child, args.kv_cache_gib)))
        return
    from rlloom.rollout.vllm.cpu_dtype import cpu_bf16_flags, engine_dtype

    print(f"CPU bf16 flags: {cpu_bf16_flags() or 'none'}; the engines' auto here: {engine_dtype('auto', on_cpu=True)}")
    args.logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {d: [] for d in DTYPES}
    for r in range(args.repeats):
        for dtype in DTYPES if r % 2 == 0 else DTYPES[::-1]:
            err = args.logs / f"{dtype}{r}.err"
            argv = [sys.executable, __file__, "--model", str(args.model), "--child", dtype]
            argv += ["--kv-cache-gib", str(args.kv_cache_gib)]
            with err.open("w") as stderr:
                done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, check=True)
            runs[dtype].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(dtype, r, runs[dtype][-1], flush=True)
    med = {d: {k: statistics.median(x[k] for x in v) for k in v[0]} for d, v in runs.items()}
    for dtype, figures in med.items():
        tokens, start = figures["tokens_per_s"], figures["start_s"]
        print(f"{dtype:>9}: start {start:.1f} s, {tokens:.0f} tok/s (median of {args.repeats})")
    f, b = med["float32"], med["bfloat16"]
    speed, start = f["tokens_per_s"] / b["tokens_per_s"], f["start_s"] / b["start_s"]
    print(f"float32/bfloat16: tokens/s {speed:.2f}x, start {start:.2f}x")


if __name__ == "__main__":  # vLLM spawns processes: keep the work behind this guard
    main()
