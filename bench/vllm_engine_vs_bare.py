"""Generation time of rlloom's `VLLMEngine` against a bare `vllm.LLM` started with TRL colocate's arguments, same
model, same requests: where does rlloom's vLLM generation lose time to TRL's (bench/grpo_vllm_vs_trl.py)?

Each side runs in a fresh subprocess (one in-process vLLM per process), one after another:
- `bare_n1`: `vllm.LLM(..., distributed_executor_backend="external_launcher", max_num_batched_tokens=4096,
  logprobs_mode="processed_logprobs", max_num_seqs=rows)` as TRL 1.16's colocate mode builds it, every sample its
  own prompt (TRL repeats each prompt G times), n=1;
- `bare_n`: the same engine, each prompt once with n=G (what rlloom sends);
- `rlloom`: `VLLMEngine` with its defaults (in-process, whole prefills on CPU, one generation thread on CPU).
All: temperature 1, `ignore_eos`, sampled-token log-probs, `enforce_eager`, fp32, random prompt ids; one warm-up
call, then the median of `--repeats` calls. Needs vLLM (`nox -s tests-vllm` builds such a venv):

    python bench/vllm_engine_vs_bare.py [--model models/smollm2-135m-instruct] [--prompts 8] [--group 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("bare_n1", "bare_n", "rlloom")


def prompt_ids(args: argparse.Namespace) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(100, 40000, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)]


def bare(args: argparse.Namespace, per_sample: bool) -> Any:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    rows = args.prompts * args.group
    llm = LLM(
        model=str(args.model),
        dtype="float32",
        max_model_len=args.prompt_len + args.max_tokens + 8,
        max_num_seqs=rows,
        distributed_executor_backend="external_launcher",
        seed=0,
        max_num_batched_tokens=4096,
        logprobs_mode="processed_logprobs",
        enforce_eager=True,
    )
    n = 1 if per_sample else args.group
    prompts = [TokensPrompt(prompt_token_ids=p) for p in prompt_ids(args) for _ in range(args.group // n)]
    params = SamplingParams(n=n, temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=0)
    return lambda: llm.generate(prompts, sampling_params=params, use_tqdm=False)


def rlloom(args: argparse.Namespace) -> Any:
    from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
    from rlloom.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

    engine = VLLMEngine(
        VLLMEngineConfig(
            model=str(args.model),
            dtype="float32",
            enforce_eager=True,
            max_model_len=args.prompt_len + args.max_tokens + 8,
            max_batch_rows=args.prompts * args.group,
            max_num_seqs=args.max_num_seqs,
            seed=0,
        )
    )
    params = SamplingParams(n=args.group, temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=True)
    requests = [GenerationRequest(prompt_ids=p, sampling=params) for p in prompt_ids(args)]
    return lambda: engine.generate(requests)


def one_side(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    run = rlloom(args) if args.run == "rlloom" else bare(args, per_sample=args.run == "bare_n1")
    run()  # warm-up
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    Path(args.out).write_text(json.dumps(seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=35)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, help="rlloom side's max_num_seqs (default: vLLM's)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--run", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("bench/vllm_engine_vs_bare.py: skipped, vLLM is not installed here (see packages/rollout/README.md)")
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.run:
        one_side(args)
        return
    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("model", "prompts", "group", "prompt_len")]
    flags += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("max_tokens", "repeats", "threads")]
    flags += [] if args.max_num_seqs is None else [f"--max-num-seqs={args.max_num_seqs}"]
    medians = {}
    for side in args.sides:
        out = Path(f"/tmp/vllm-engine-vs-bare-{os.getpid()}-{side}.json")
        subprocess.run(
            [sys.executable, __file__, *flags, "--run", side, "--out", str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        seconds = json.loads(out.read_text())
        out.unlink()
        medians[side] = statistics.median(seconds)
        print(
            f"{side:8s} median {medians[side]:.2f} s  runs {[round(s, 2) for s in seconds]}  "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    for side in [s for s in args.sides if s != "rlloom" and "rlloom" in medians]:
        print(f"rlloom / {side}: {medians['rlloom'] / medians[side]:.2f}x the time")


if __name__ == "__main__":
    main()
