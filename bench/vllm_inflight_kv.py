"""What an in-flight weight push costs VLLMAsyncEngine's requests: `inflight_kv="keep"` (vLLM freezes them with their
KV blocks and they decode on) against `"reprefill"` (vLLM aborts them and each comes back as a new request, its
prompt + tokens so far prefilled again), on one engine, the modes alternating.

Each batch is `--rows` greedy requests of `--prompt` random prompt tokens and `--tokens` new ones, with `--pushes`
pauses spread evenly over the time a batch without pushes takes (measured first): pause, resume with the next policy
version. No weights are loaded: the load costs the same in both modes, so the difference is the KV choice alone.
Every batch has prompts of its own (no prefix-cache hits between batches). Printed: the median wall time per mode
and without pushes over `--repeats`, the ratio reprefill / keep from the same run, and the requests reprefill sent
back to vLLM.

Run: .nox/bench-vllm/bin/python bench/vllm_inflight_kv.py [--model models/smollm2-135m-instruct] [--rows 16]
     [--prompt 512] [--tokens 128] [--pushes 2] [--repeats 3]   (default model: a tiny Qwen2, a smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer
from rlloom.rollout.vllm.engine import VLLMEngineConfig

sys.path.insert(0, str(Path(__file__).parent))  # bench/ is not a package
from _vllm_tiny import vllm_tiny_qwen2


def tiny_model(folder: Path) -> tuple[str, str]:
    """The tiny test model (head size 64, which vLLM's CPU attention runs) and its tokenizer, saved in `folder`."""
    tok = char_tokenizer()
    vllm_tiny_qwen2(tok, hidden_size=128, context=4096, seed=0).save_pretrained(folder / "model")
    tok.save_pretrained(folder / "tokenizer")
    return str(folder / "model"), str(folder / "tokenizer")


def batch(engine: Any, prompts: list[list[int]], tokens: int, push_at: list[float]) -> float:
    """Wall seconds for the greedy batch, pausing and resuming at each of `push_at` (seconds after submission)."""
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)

    async def run() -> float:
        started = time.perf_counter()
        tasks = [
            asyncio.create_task(engine.agenerate(GenerationRequest(prompt_ids=p, sampling=sampling))) for p in prompts
        ]
        for at in push_at:
            await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
            await asyncio.to_thread(engine.pause_generation)
            await asyncio.to_thread(engine.resume_generation, engine.policy_version + 1)
        done = await asyncio.gather(*tasks)
        assert all(len(c[0].token_ids) == tokens for c in done)
        return time.perf_counter() - started

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder (default: the tiny test model)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--pushes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine

    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = (args.model, args.model) if args.model else tiny_model(Path(tmp))
        config = VLLMEngineConfig(
            model=model, tokenizer=tokenizer, dtype="float32", enforce_eager=True,
            max_model_len=args.prompt + args.tokens + 16,
        )  # fmt: skip
        engine = VLLMAsyncEngine(config)
        try:
            vocab = len(engine.tokenizer)
            gen = torch.Generator().manual_seed(0)

            def prompts() -> list[list[int]]:
                return [torch.randint(10, vocab - 10, (args.prompt,), generator=gen).tolist() for _ in range(args.rows)]

            batch(engine, prompts(), args.tokens, [])  # warm-up
            plain = [batch(engine, prompts(), args.tokens, []) for _ in range(args.repeats)]
            span = statistics.median(plain)
            push_at = [span * (i + 1) / (args.pushes + 1) for i in range(args.pushes)]
            times: dict[str, list[float]] = {"keep": [], "reprefill": []}
            resent = 0
            for repeat in range(args.repeats):
                for mode in ("keep", "reprefill") if repeat % 2 == 0 else ("reprefill", "keep"):
                    engine.config = engine.config.model_copy(update={"inflight_kv": mode})
                    before = engine.continuations
                    times[mode].append(batch(engine, prompts(), args.tokens, push_at))
                    resent += engine.continuations - before if mode == "reprefill" else 0
        finally:
            engine.close()
    keep, reprefill = statistics.median(times["keep"]), statistics.median(times["reprefill"])
    print(
        f"{args.rows} rows x ({args.prompt} prompt + {args.tokens} new) tokens, {args.pushes} push(es), "
        f"{args.repeats} repeats, model {args.model or 'tiny'}"
    )
    print(f"no push    {span:7.2f} s  {_seconds(plain)}")
    print(f"keep       {keep:7.2f} s  {_seconds(times['keep'])}")
    print(f"reprefill  {reprefill:7.2f} s  {_seconds(times['reprefill'])}  ({resent} requests resent)")
    print(f"reprefill / keep: {reprefill / keep:.2f}x   keep / no push: {keep / span:.2f}x")


def _seconds(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


if __name__ == "__main__":
    main()
