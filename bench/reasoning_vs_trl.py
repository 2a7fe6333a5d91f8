"""Same-run comparison of rlloom's GRPO Trainer against TRL's `GRPOTrainer` on the reasoning app's toy task.

Both train the same tiny character-level Qwen2 (`rlloom.core_rl.tiny`, seeded, then a short shared supervised
warm-up from the app's `supervised_warmup` so rewards have signal) on the app's digit-reversal prompts
(`toy_task.reverse_splits`), rewarded by the app's rubric (`toy_task.reversal_rubric`: 0.5 * exact + 0.5 * digits in
place). Every run starts from the same saved weights; runs alternate (rlloom, TRL, TRL, rlloom, ...) so load on a
shared machine hits both alike. Reported per method: wall seconds per training step (the interval between
consecutive step ends, median over the steps after `--skip-steps`), the same in CPU seconds of this process (steadier
than wall time when other work shares the cores; with one torch thread it is the work done), wall seconds of it
spent generating, generated tokens per second of step wall time, and the mean sampled reward of the first and last
`--last` steps (a sanity line that both trained, not a correctness claim). Needs the root `bench` dependency group
(trl).

Matched (rlloom field = TRL `GRPOConfig` field):
- prompts per step and group size: `data.train_batch_size` = P, `rollout.n` = `num_generations` = G, with
  `per_device_train_batch_size` = P * G completions, `gradient_accumulation_steps` = 1 (so `steps_per_generation`
  = 1): one generation and one optimizer step per training step (`actor.mini_batch_size` = P, `ppo_epochs` = 1 =
  `num_iterations`); the whole batch in one forward/backward (`actor.max_tokens_per_micro_batch` is large).
- sampling: `rollout.temperature` = `temperature`, `top_p` = 1, `top_k` = 0 in both, `rollout.max_tokens` =
  `max_completion_length`; EOS ends a sample and is part of it in both.
- loss: PPO clip 0.2 both sides (`algorithm.policy_loss.clip_low/high` = `epsilon`, `epsilon_high` unset),
  token-mean over the batch (`policy_loss.agg_mode=token-mean` = `loss_type="dapo"`, TRL's default), no KL
  (`kl.use_loss=False` = `beta=0.0`, no reference model), no entropy bonus, grad-norm clip 1.0 (`grad_clip` =
  `max_grad_norm`).
- advantages: group-normalised, (r - group mean) / group std (`advantage.estimator=grpo`, `advantage.norm_by_std` =
  `scale_rewards="group"`, TRL's default).
- optimizer: the same object construction for both: rlloom's `build_optimizer` (torch AdamW, foreach, betas
  (0.9, 0.999), weight decay 0.01 on every parameter, constant lr) is handed to TRL through the Trainer's
  `optimizers=` argument, so TRL's `optim`, `weight_decay` and `lr_scheduler_type` are not in play.
- precision and device: fp32 on CPU (`bf16=False`, `use_cpu=True`; TRL defaults bf16 to True), no gradient
  checkpointing (`gradient_checkpointing=False`; GRPOConfig defaults it to True), SDPA attention, one torch thread
  by default (`--threads`), same seed (both shuffle the same prompts each epoch, each in its own order).
Not matched (inherent to each trainer):
- generation path: TRL calls transformers `generate` once on all P * G rows (`use_vllm=False`, no continuous
  batching); rlloom samples with its HFEngine (its own KV-cache decode loop, rows refilled as they finish), here
  with `max_batch_rows` = P * G so both decode one batch of the same width.
- old log-probs: with one iteration on fresh samples both skip the no-grad forward and use the training forward's
  detached log-probs (ratio exactly 1): TRL by its own rule, rlloom under `algorithm.old_logprobs=auto` (its
  default). `--old-logprobs recompute` makes rlloom run the separate no-grad forward first, as veRL does every step.
- advantage epsilon: TRL divides by std + 1e-4, rlloom by std + 1e-6 (both Bessel-corrected std); prompts render
  through the same ChatML template and char tokenizer to the same ids in both.
- bookkeeping: TRL goes through the transformers `Trainer` loop (callbacks, logging every step with
  `logging_steps=1`, `report_to="none"`); rlloom builds its TrajectoryBatch and logs to an in-memory tracker, and
  writes one checkpoint after the last step (outside the timed intervals).
- generation seconds come from each trainer's own phase boundary: rlloom's `timing/rollout_s` (render prompts,
  sample, detokenise, build trajectories) and, for TRL, a timer wrapped around the private `GRPOTrainer._generate`
  (tokenise prompts, `generate`, decode; TRL 1.16), which also gives its sampled-token count.

Run: .venv/bin/python bench/reasoning_vs_trl.py [--steps 30] [--repeats 3] [--threads 1]
Prints a markdown table of medians over repeats and rlloom's speed-up, TRL / rlloom for seconds and rlloom / TRL
for tokens per second (> 1: rlloom is faster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rlloom_apps.reasoning.demo import rubric_reward
from rlloom_apps.reasoning.toy_task import answer_of, reversal_rubric, reverse_splits
from rlloom_apps.reasoning.warmup import supervised_warmup
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, ProgressCallback, TrainerCallback

from rlloom.core_rl.config.loading import config_from_dict
from rlloom.core_rl.config.schema import ActorConfig
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.optim import build_optimizer
from rlloom.rewards.integrations.trl import trl_reward
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

REWARD = reversal_rubric()


@dataclass(frozen=True)
class Settings:
    """What both trainers share (the rlloom field = the GRPOConfig field where there is one)."""

    steps: int = 30  # training steps per run (trainer.total_steps = max_steps)
    prompts: int = 32  # prompts per step (data.train_batch_size; TRL: per_device_train_batch_size / G)
    group: int = 8  # samples per prompt (rollout.n = num_generations)
    max_tokens: int = 6  # response length limit (rollout.max_tokens = max_completion_length): 3 digits + EOS + slack
    temperature: float = 1.0  # sampling temperature (rollout.temperature = temperature)
    lr: float = 1e-3  # AdamW learning rate, constant (actor.lr); the tiny model needs a large one
    clip: float = 0.2  # PPO ratio clip (algorithm.policy_loss.clip_low/high = epsilon)
    seed: int = 0  # model init, warm-up, trainers
    sft_steps: int = 300  # shared supervised warm-up steps before RL (0: start from the random init)
    hidden_size: int = 64  # tiny Qwen2 width
    num_layers: int = 2  # tiny Qwen2 depth
    threads: int = 1  # torch intra-op threads
    old_logprobs: str = "auto"  # rlloom only (algorithm.old_logprobs): recompute = veRL's extra no-grad forward


@dataclass
class RunLog:
    """What one training run recorded, per step (index i = step i + 1)."""

    step_ends: list[float] = field(default_factory=list)  # perf_counter at each step end; [0] = just before step 1
    step_cpu_ends: list[float] = field(default_factory=list)  # process_time at the same moments
    rewards: list[float] = field(default_factory=list)  # mean sampled reward of the step
    gen_seconds: list[float] = field(default_factory=list)  # time in the generation phase (tokenise+sample+decode)
    gen_tokens: list[int] = field(default_factory=list)  # response tokens sampled (EOS included)
    old_logprob_seconds: list[float] = field(default_factory=list)  # no-grad old-log-prob forward (rlloom only)

    def mark_step_end(self) -> None:
        self.step_ends.append(time.perf_counter())
        self.step_cpu_ends.append(time.process_time())

    def summary(self, skip: int, last: int) -> dict[str, float]:
        """Medians over the steps after the first `skip`, and the mean reward of the last `last` steps."""
        intervals = [b - a for a, b in zip(self.step_ends, self.step_ends[1:], strict=False)]
        cpu = [b - a for a, b in zip(self.step_cpu_ends, self.step_cpu_ends[1:], strict=False)]
        kept = range(min(skip, len(intervals) - 1), len(intervals))
        return {
            "step_s": statistics.median(intervals[i] for i in kept),
            "step_cpu_s": statistics.median(cpu[i] for i in kept),
            "gen_s": statistics.median(self.gen_seconds[i] for i in kept),
            "gen_tok_per_s": statistics.median(self.gen_tokens[i] / intervals[i] for i in kept),
            "old_logprob_s": statistics.median(self.old_logprob_seconds[i] for i in kept)
            if self.old_logprob_seconds
            else 0.0,
            "reward_first": sum(self.rewards[:last]) / len(self.rewards[:last]),
            "reward_last": sum(self.rewards[-last:]) / len(self.rewards[-last:]),
        }


def prepare_model(settings: Settings, folder: Path) -> list[dict[str, Any]]:
    """Save the shared starting point in `folder` (weights) and `folder/tokenizer`; returns the prompts.

    The tokenizer gets a folder of its own: transformers 5 `AutoTokenizer.from_pretrained` on a folder that also
    holds the Qwen2 config.json builds a byte-level `Qwen2Tokenizer` that drops the ChatML newlines, so the
    trainers would see other prompt ids than the warm-up did.
    """
    train_rows, _ = reverse_splits(3, held_out=64, seed=settings.seed)
    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers, seed=settings.seed)
    if settings.sft_steps:
        examples = [(row["prompt"], answer_of(row)) for row in train_rows]
        losses = supervised_warmup(model, tokenizer, examples, steps=settings.sft_steps, seed=settings.seed)
        print(f"shared supervised warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder / "tokenizer")
    reloaded = AutoTokenizer.from_pretrained(folder / "tokenizer")
    first = train_rows[0]["prompt"]
    if reloaded.apply_chat_template(first, add_generation_prompt=True) != tokenizer.apply_chat_template(
        first, add_generation_prompt=True
    ):
        raise RuntimeError(f"{folder / 'tokenizer'} does not reload as the char tokenizer; the comparison is off")
    return train_rows


# ---------------------------------------------------------------------------------------------------- rlloom
class _StepRecorder:
    """An rlloom Tracker that keeps the step-end times and the metrics the table needs, in memory."""

    def __init__(self, log: RunLog, rows_per_step: int) -> None:
        self.run_log, self.rows = log, rows_per_step

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run_log.mark_step_end()
        self.run_log.rewards.append(metrics["reward/mean"])
        self.run_log.gen_seconds.append(metrics["timing/rollout_s"])
        self.run_log.gen_tokens.append(round(metrics["response_length/mean"] * self.rows))
        self.run_log.old_logprob_seconds.append(metrics.get("timing/old_logprobs_s", 0.0))  # 0: skipped

    def log_config(self, config: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def rlloom_config(settings: Settings, model_dir: Path, output_dir: Path) -> dict[str, Any]:
    s = settings
    return {
        "model": {
            "path": str(model_dir),
            "tokenizer_path": str(model_dir / "tokenizer"),
            "dtype": "float32",
            "attn_implementation": "sdpa",
        },
        "data": {"train_batch_size": s.prompts, "shuffle": True},
        "rollout": {"n": s.group, "temperature": s.temperature, "top_p": 1.0, "top_k": 0, "max_tokens": s.max_tokens},
        "algorithm": {
            "advantage": {"estimator": "grpo", "norm_by_std": True},
            "policy_loss": {"agg_mode": "token-mean", "clip_low": s.clip, "clip_high": s.clip},
            "kl": {"use_loss": False},
            "entropy": {"coef": 0.0},
            "old_logprobs": s.old_logprobs,
        },
        "actor": {
            **_actor_fields(s),
            "ppo_epochs": 1,
            "mini_batch_size": s.prompts,  # one optimizer step per training step
            "max_tokens_per_micro_batch": 10**7,  # one forward/backward, as TRL does
        },
        "trainer": {
            "total_steps": s.steps,
            "seed": s.seed,
            "device": "cpu",
            "resume": "never",
            "output_dir": str(output_dir),
            "save_every": 0,
            "keep_last": 1,
        },
    }


def _actor_fields(settings: Settings) -> dict[str, Any]:
    """The optimizer settings both trainers use (rlloom's ActorConfig defaults otherwise: AdamW, wd 0.01)."""
    return {"lr": settings.lr, "grad_clip": 1.0, "lr_schedule": "constant", "warmup_steps": 0}


def run_rlloom(settings: Settings, model_dir: Path, rows: Sequence[dict[str, Any]], output_dir: Path) -> RunLog:
    config = config_from_dict(rlloom_config(settings, model_dir, output_dir))
    tokenizer = char_tokenizer()  # the warm-up's own tokenizer, rebuilt (TRL gets one too)
    engines: list[HFEngine] = []
    rows_per_step = settings.prompts * settings.group

    def engine_on(module: nn.Module) -> HFEngine:
        engines.append(HFEngine(module, tokenizer, HFEngineConfig(max_batch_rows=rows_per_step)))
        return engines[-1]

    log = RunLog()
    trainer = Trainer(
        config,
        engine=engine_on,
        reward_fn=rubric_reward,
        train_data=rows,
        trackers=[_StepRecorder(log, rows_per_step)],
    )
    torch.set_num_threads(settings.threads)
    log.mark_step_end()
    try:
        trainer.fit()
    finally:
        for engine in engines:
            engine.close()
    return log


# ---------------------------------------------------------------------------------------------------- TRL
class _StepCallback(TrainerCallback):
    """Step-end times and each step's logged reward (`logging_steps=1`)."""

    def __init__(self, log: RunLog) -> None:
        self.run_log = log

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run_log.mark_step_end()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run_log.mark_step_end()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
        if logs and "reward" in logs:
            self.run_log.rewards.append(float(logs["reward"]))


def _timed_generate(generate: Callable[..., Any], log: RunLog) -> Callable[..., Any]:
    """Wrap GRPOTrainer._generate (tokenise prompts, `generate`, decode) to time it and count sampled tokens."""

    def timed(prompts: list[Any]) -> Any:
        start = time.perf_counter()
        out = generate(prompts)
        log.gen_seconds.append(time.perf_counter() - start)
        log.gen_tokens.append(sum(len(ids) for ids in out[1]))  # (prompt_ids, completion_ids, ...)
        return out

    return timed


def run_trl(settings: Settings, model_dir: Path, rows: Sequence[dict[str, Any]], output_dir: Path) -> RunLog:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    s = settings
    args = GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=s.prompts * s.group,  # TRL counts completions, not prompts
        gradient_accumulation_steps=1,
        num_generations=s.group,
        num_iterations=1,
        max_completion_length=s.max_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=s.lr,  # informational: the optimizer below is passed in
        beta=0.0,
        epsilon=s.clip,
        loss_type="dapo",
        scale_rewards="group",
        max_grad_norm=1.0,
        max_steps=s.steps,
        use_vllm=False,
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
    tokenizer = char_tokenizer()
    optimizer, scheduler = build_optimizer(model.parameters(), ActorConfig(**_actor_fields(s)), s.steps)
    dataset = Dataset.from_list([{"prompt": row["prompt"], "ground_truth": answer_of(row)} for row in rows])
    log = RunLog()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward(REWARD, name="reversal"),  # the same rubric, through rlloom's public TRL adapter
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        callbacks=[_StepCallback(log)],
    )
    for quiet in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(quiet)
    trainer._generate = _timed_generate(trainer._generate, log)  # type: ignore[method-assign]
    torch.set_num_threads(s.threads)
    trainer.train()
    return log


# ---------------------------------------------------------------------------------------------------- main
RUNNERS = {"rlloom": run_rlloom, "TRL": run_trl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    for name in ("steps", "prompts", "group", "max_tokens", "lr", "seed", "sft_steps", "threads", "old_logprobs"):
        value = getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--repeats", type=int, default=3, help="runs per method, alternating the order")
    parser.add_argument("--skip-steps", type=int, default=2, help="first steps left out of the timing medians")
    parser.add_argument("--last", type=int, default=5, help="steps whose mean reward is printed")
    args = parser.parse_args()
    settings = Settings(**{k: getattr(args, k) for k in Settings.__dataclass_fields__ if hasattr(args, k)})
    torch.set_num_threads(settings.threads)
    warnings.filterwarnings("ignore")
    import transformers
    import trl

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
        f"{settings.threads} thread(s); {settings.prompts} prompts x {settings.group} samples, "
        f"<= {settings.max_tokens} tokens, {settings.steps} steps, {args.repeats} repeats\n"
    )
    results: dict[str, list[dict[str, float]]] = {name: [] for name in RUNNERS}
    with tempfile.TemporaryDirectory(prefix="rlloom-vs-trl-") as tmp:
        model_dir = Path(tmp) / "start"
        rows = prepare_model(settings, model_dir)
        for repeat in range(args.repeats):
            order = list(RUNNERS) if repeat % 2 == 0 else list(RUNNERS)[::-1]
            for name in order:
                log = RUNNERS[name](settings, model_dir, rows, Path(tmp) / f"{name}-{repeat}")
                summary = log.summary(args.skip_steps, args.last)
                results[name].append(summary)
                print(
                    f"  run {repeat + 1} {name:<6} step {summary['step_s'] * 1e3:7.1f} ms, "
                    f"reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}",
                    flush=True,
                )
    print_table(results, args.last)


def print_table(results: dict[str, list[dict[str, float]]], last: int) -> None:
    """Medians over repeats; the last column is rlloom's speed-up (> 1: rlloom is faster)."""

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print("\n| per training step, median over repeats | rlloom | TRL | rlloom speed-up |")
    print("|---|---|---|---|")
    rows = [("wall s", "step_s"), ("CPU s of this process", "step_cpu_s"), ("of which generation s (wall)", "gen_s")]
    for label, key in rows:
        ours, theirs = med("rlloom", key), med("TRL", key)
        print(f"| {label} | {ours:.3f} | {theirs:.3f} | {theirs / ours:.2f} |")
    old_lp = med("rlloom", "old_logprob_s")
    print(f"| of which no-grad old-log-prob forward s | {f'{old_lp:.3f}' if old_lp else 'skipped'} | skipped | |")
    ours, theirs = med("rlloom", "gen_tok_per_s"), med("TRL", "gen_tok_per_s")
    print(f"| generated tokens per wall s | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |")
    print(
        "\nspeed-up = TRL / rlloom for seconds, rlloom / TRL for tokens per second.\n"
        f"sanity, mean sampled reward (first {last} steps -> last {last} steps, median over repeats): "
        + "; ".join(f"{n} {med(n, 'reward_first'):.3f} -> {med(n, 'reward_last'):.3f}" for n in results)
    )


if __name__ == "__main__":
    main()
