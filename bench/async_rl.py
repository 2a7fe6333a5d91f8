"""Trained tokens per second: synchronous, one-step off-policy and fully asynchronous RL (`trainer.mode=async`,
max_staleness 1, 2, 4), same run otherwise, with long-tailed response lengths (issue 42).

Each run trains the tiny Qwen2 (hidden 128, 2 layers) for the same steps with `HFEngine` on its own copy of the
weights and a rule reward (the share of digits: a random model gets some signal). Response lengths are made
long-tailed by the engine wrapper `LongTail`: each request samples past EOS up to a length drawn from a lognormal
(median 12 tokens, sigma 1.0, capped at rollout.max_tokens=96; p99 ~ 123, so ~4% reach the cap), as a reasoning
task's lengths vary; the draw depends only on the request's prompt and sample seed stream, the same in every mode.
Synchronous RL waits for the longest response of each batch; async starts the next groups as soon as admission
allows, so short groups fill the time the long ones take.

Run: .venv/bin/python bench/async_rl.py [--steps 6] [--seeds 0 1 2]
Prints per mode the median over seeds of trained response tokens per wall-clock second (the tokens the update
trained on, batch/response_tokens summed over steps, over the whole fit()), its ratio to sync measured in the same
run (ratio of medians, and the median of each seed's ratio to the sync run just before it), the last step's
reward and the largest staleness seen. Torch runs one intra-op thread per phase, so on a
GPU cluster's disaggregated placement (generation and training on their own devices) the overlap carries over.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.rollout.hf.engine import HFEngine

sys.path.insert(0, str(Path(__file__).parent))  # bench/ is not a package
from _modes import MODES
from _rl_runs import save_tiny_model, timed_fit

MAX_TOKENS = 96


class LongTail:
    """An engine whose responses have long-tailed lengths: every request samples (ignoring EOS) up to a length
    drawn from a lognormal; everything else, capabilities included, is the wrapped engine's."""

    def __init__(self, engine: HFEngine, seed: int) -> None:
        self.engine = engine
        self.seed = seed

    def __getattr__(self, name: str) -> Any:  # pause/resume, tokenizer, close ... of the engine
        return getattr(self.engine, name)

    def _length(self, request: GenerationRequest) -> int:
        rng = random.Random(f"{self.seed}-{request.messages or request.prompt_ids}-{request.request_id}")
        return max(1, min(MAX_TOKENS, round(12 * math.exp(rng.gauss(0.0, 1.0)))))

    def _long_tailed(self, request: GenerationRequest) -> GenerationRequest:
        sampling = request.sampling.model_copy(update={"max_tokens": self._length(request), "ignore_eos": True})
        return GenerationRequest(
            prompt_ids=request.prompt_ids,
            messages=request.messages,
            sampling=sampling,
            request_id=request.request_id,
            chat_template_kwargs=request.chat_template_kwargs,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self.engine.generate([self._long_tailed(r) for r in requests])

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        return await self.engine.agenerate(self._long_tailed(request))

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.engine.update_weights(named_tensors)


def run(model_dir: Path, out: Path, mode: list[str], *, steps: int, seed: int, size: str = "128x2") -> dict[str, float]:
    torch.set_num_threads(1)
    overrides = [
        *mode,
        f"trainer.seed={seed}",
        "trainer.save_every=0",
        "rollout.n=4",
        f"rollout.max_tokens={MAX_TOKENS}",
        "actor.mini_batch_size=8",
        "actor.ppo_epochs=1",
    ]
    wall, _ = timed_fit(
        model_dir, out, overrides, steps=steps, rows=256, size=size, engine_wrapper=lambda e: LongTail(e, seed)
    )
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in lines if "batch/response_tokens" in line]
    tokens = sum(line["batch/response_tokens"] for line in lines)
    return {
        "tokens_per_s": tokens / wall,
        "reward": lines[-1]["reward/mean"],
        "staleness_max": max(line.get("async/staleness_max", line.get("rollout/policy_lag", 0.0)) for line in lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--size", default="128x2", help="hidden size x layers of the tiny Qwen2 (e.g. 512x4)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "model", args.size)
        run(model_dir, Path(tmp) / "warmup", MODES["sync"], steps=1, seed=0, size=args.size)  # warm-up, not counted
        for seed in args.seeds:
            for name, mode in MODES.items():  # modes interleaved per seed, so load drifts hit all alike
                out = Path(tmp) / f"{name.replace(' ', '_')}_{seed}"
                results[name].append(run(model_dir, out, mode, steps=args.steps, seed=seed, size=args.size))
                print(f"seed {seed} {name}: {results[name][-1]}", flush=True)
    sync = statistics.median(r["tokens_per_s"] for r in results["sync"])
    print(f"\n{args.steps} GRPO steps (Qwen2 {args.size}, 8 prompts x 4 samples, lognormal lengths, cap {MAX_TOKENS}), "
          f"median over seeds {args.seeds}:")  # fmt: skip
    print("| mode | trained tokens/s | vs sync (medians) | vs sync (median of per-seed ratios) | last-step reward "
          "| max staleness |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        ratios = [r["tokens_per_s"] / s["tokens_per_s"] for r, s in zip(runs, results["sync"], strict=True)]
        paired = statistics.median(ratios)
        reward = statistics.median(r["reward"] for r in runs)
        stale = max(r["staleness_max"] for r in runs)
        print(f"| {name} | {tps:.1f} | {tps / sync:.2f}x | {paired:.2f}x | {reward:.3f} | {stale:.0f} |")


if __name__ == "__main__":
    main()
