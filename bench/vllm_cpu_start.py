"""vLLM on CPU, compiled against eager: engine start, generation tokens/s and one weight sync, SmolLM2-135M-Instruct.

Each start runs in a fresh process (as a user's run does, so a compile cache helps only if vLLM loads it from
disk), alternating eager and compiled `--repeats` times; we print the medians and the ratios eager / compiled of
this run. Both get the same explicit KV cache (`kv_cache_memory_bytes`, what the engines now pass on CPU), the same
32 distinct random prompts x 64 new tokens (temperature 1, ignore_eos), timed after one warm-up batch.
The weight sync pushes the model's own weights as the trainer does; the log lines it printed are counted.

    python bench/vllm_cpu_start.py --model models/smollm2-135m-instruct [--repeats 2]
    (in the bench-vllm venv: python3 -m nox -s bench-vllm -R -- vllm_cpu_start --model ...)
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


def child(model: Path, eager: bool, kv_gib: float) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
    from rlloom.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

    started = time.perf_counter()
    engine = VLLMEngine(
        VLLMEngineConfig(
            model=str(model),
            dtype="float32",
            enforce_eager=eager,
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
    weights = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
    print("=== weight sync begins", file=sys.stderr, flush=True)
    started = time.perf_counter()
    engine.begin_weight_sync(1)
    engine.update_weights(dict(weights))
    engine.finish_weight_sync()
    sync_s = time.perf_counter() - started
    print("=== weight sync ends", file=sys.stderr, flush=True)
    engine.close()
    return {"start_s": start_s, "tokens_per_s": tokens, "sync_s": sync_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--child", choices=["eager", "compiled"], default=None)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/vllm_cpu_start"), help="each start's stderr")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.child == "eager", args.kv_cache_gib)))
        return
    args.logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {"eager": [], "compiled": []}
    for r in range(args.repeats):
        for mode in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            err = args.logs / f"{mode}{r}.err"
            argv = [sys.executable, __file__, "--model", str(args.model), "--child", mode]
            argv += ["--kv-cache-gib", str(args.kv_cache_gib)]
            with err.open("w") as stderr:
                done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, check=True)
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(mode, r, runs[mode][-1], flush=True)
    med = {m: {k: statistics.median(x[k] for x in v) for k in v[0]} for m, v in runs.items()}
    for mode, figures in med.items():
        print(f"{mode:>9}: start {figures['start_s']:.1f} s, {figures['tokens_per_s']:.0f} tok/s, "
              f"sync {figures['sync_s']:.2f} s (median of {args.repeats})")  # fmt: skip
    e, c = med["eager"], med["compiled"]
    ratio = {k: e[k] / c[k] for k in e}
    print(f"eager/compiled: start {ratio['start_s']:.2f}x, tokens/s {ratio['tokens_per_s']:.2f}x")


if __name__ == "__main__":  # vLLM spawns processes: keep the work behind this guard
    main()
