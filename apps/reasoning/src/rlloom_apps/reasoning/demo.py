"""`reasoning demo`: train a tiny model end to end on CPU with the real rlloom components.

Wiring only: a character-level Qwen2 (rlloom.core_rl.tiny) gets a short supervised warm-up on digit-string
reversal that stops as soon as it answers some training strings exactly, then GRPO through rlloom.core_rl's
Trainer, sampling with rlloom.rollout's HFEngine built on the actor's own module (`engine=` a factory, no weight
copy) and rewarded by an rlloom.rewards Rubric (exact answer + digits in place). Validation on held-out strings
runs before training and every few steps; the run folder holds config.yaml, metrics.jsonl, checkpoints and the
before/after table, which is also printed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rlloom_apps.reasoning.demo_report import before_after_table
from rlloom_apps.reasoning.toy_task import answer_of, reversal_rubric, reverse_splits
from rlloom_apps.reasoning.warmup import supervised_warmup
from torch import nn

from rlloom.core_rl import Trainer, char_tokenizer, tiny_qwen2
from rlloom.core_rl.config import RLConfig, demo_overrides, load_config
from rlloom.core_rl.contracts import RewardOutput, SamplingParams, Trajectory
from rlloom.core_rl.observe import read_curves
from rlloom.core_rl.phases import score, single_turn_collector
from rlloom.core_rl.run import fresh_run_dir
from rlloom.rollout import HFEngine

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"
REWARD = reversal_rubric()


@dataclass(frozen=True)
class DemoSettings:
    """What the demo varies besides the trainer config: model size, warm-up and the data split."""

    hidden_size: int = 64
    num_layers: int = 2
    warmup_max_steps: int = 1500  # upper bound; the warm-up usually stops far earlier (warmup_target)
    warmup_lr: float = 1e-3  # 3e-3 stalls this model on the "same digits for every prompt" plateau
    warmup_target: float = 0.2  # stop once this share of the probe strings is answered exactly (greedy)
    warmup_check_every: int = 20  # warm-up steps between probes
    probe_rows: int = 64  # training strings the warm-up probes (never held-out ones)
    length: int = 3
    held_out: int = 64


@dataclass(frozen=True)
class HeldOutScore:
    """Greedy answers on the held-out strings, scored by the demo's rubric."""

    exact: float  # share answered exactly
    digits: float  # share of digits in the right place
    reward: float  # mean rubric score: what the trainer's validation logs as val/reward/mean


@dataclass(frozen=True)
class DemoResult:
    """Where the run went and what it showed (held-out scores are greedy, as the trainer validates)."""

    output_dir: Path
    untrained: HeldOutScore  # the randomly initialised model
    before: HeldOutScore  # after the warm-up, before GRPO
    after: HeldOutScore  # after the last GRPO step
    warmup_steps: int  # warm-up steps actually run
    val_curve: list[tuple[int, float]]  # (step, held-out reward)
    train_curve: list[tuple[int, float]]  # (step, mean sampled reward)
    seconds: float


def demo_config(model_dir: Path, output_dir: Path, steps: int | None, seed: int, overrides: Sequence[str]) -> RLConfig:
    """configs/demo.yaml, then the demo's own paths, seed and --steps, then the user's dotted overrides (which win)."""
    own = demo_overrides(model_path=model_dir, output_dir=output_dir, seed=seed, steps=steps)
    return load_config(DEMO_CONFIG, [*own, *overrides])


def rubric_reward(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    """The reversal rubric on each response's text: 0.5 * exact + 0.5 * share of digits in place."""
    outputs = []
    for traj in trajectories:
        result = REWARD(traj.response_text, traj.ground_truth)
        components = {name: result.components[name] for name in ("exact", "digits")}
        outputs.append(RewardOutput(score=result.score, components=components, error=result.error))
    return outputs


def run_demo(
    *,
    output_dir: Path | None = None,
    steps: int | None = None,
    seed: int = 0,
    overrides: Sequence[str] = (),
    settings: DemoSettings = DemoSettings(),
) -> DemoResult:
    """Warm up, then GRPO with validation; writes and returns the held-out scores before and after."""
    started = time.perf_counter()
    output_dir = fresh_run_dir(output_dir, "demo")
    model_dir = output_dir / "warmup_model"
    config = demo_config(model_dir, output_dir, steps, seed, overrides)  # bad overrides fail before any work
    max_tokens = config.rollout.max_tokens
    torch.manual_seed(seed)
    train_rows, held_out_rows = reverse_splits(settings.length, settings.held_out)

    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers, seed=seed)
    untrained = held_out_score(model, tokenizer, held_out_rows, max_tokens)
    probe = train_rows[: settings.probe_rows]
    probe_exact: list[float] = []

    def warm_enough() -> bool:
        probe_exact.append(held_out_score(model, tokenizer, probe, max_tokens).exact)
        return probe_exact[-1] >= settings.warmup_target

    losses = supervised_warmup(
        model,
        tokenizer,
        [(row["prompt"], answer_of(row)) for row in train_rows],
        steps=settings.warmup_max_steps,
        lr=settings.warmup_lr,
        seed=seed,
        stop=warm_enough,
        check_every=settings.warmup_check_every,
    )
    if losses:
        reached = f", exact on {len(probe)} training strings {probe_exact[-1]:.2f}" if probe_exact else ""
        print(f"warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}{reached}")
    # the warmed-up model is GRPO's starting point and (when a KL term is on) its reference policy
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    before = held_out_score(model, tokenizer, held_out_rows, max_tokens)

    engines: list[HFEngine] = []
    actor_modules: list[nn.Module] = []

    def engine_on(module: nn.Module) -> HFEngine:
        """The trainer hands over its actor's module: rollouts sample the very weights being trained."""
        actor_modules.append(module)
        engines.append(HFEngine(module, tokenizer))
        return engines[-1]

    trainer = Trainer(
        config,
        engine=engine_on,
        reward_fn=rubric_reward,
        train_data=train_rows,
        val_data=held_out_rows,
    )
    try:
        trainer.fit()
    finally:
        for engine in engines:
            engine.close()
    after = held_out_score(actor_modules[0], tokenizer, held_out_rows, max_tokens)

    val_curve, train_curve = read_curves(output_dir / "metrics.jsonl")
    result = DemoResult(
        output_dir=output_dir,
        untrained=untrained,
        before=before,
        after=after,
        warmup_steps=len(losses),
        val_curve=val_curve,
        train_curve=train_curve,
        seconds=time.perf_counter() - started,
    )
    write_summary(result)
    return result


def held_out_score(model: nn.Module, tokenizer: Any, rows: Sequence[dict[str, Any]], max_tokens: int) -> HeldOutScore:
    """Greedy answers to `rows` through HFEngine, scored exactly as the trainer's validation scores them."""
    engine = HFEngine(model, tokenizer)
    try:
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
        trajectories = single_turn_collector(engine)(rows, greedy, "eval")
    finally:
        engine.close()
    score(trajectories, rubric_reward)
    count = len(trajectories)
    return HeldOutScore(
        exact=sum(t.reward_components["exact"] for t in trajectories) / count,
        digits=sum(t.reward_components["digits"] for t in trajectories) / count,
        reward=sum(t.reward or 0.0 for t in trajectories) / count,
    )


def write_summary(result: DemoResult) -> None:
    """before_after.md (the table the CLI prints) and summary.json in the run folder."""
    (result.output_dir / "before_after.md").write_text(before_after_table(result) + "\n")
    summary = {
        "untrained": asdict(result.untrained),
        "before_grpo": asdict(result.before),
        "after_grpo": asdict(result.after),
        "warmup_steps": result.warmup_steps,
        "val_curve": result.val_curve,
        "seconds": round(result.seconds, 1),
    }
    (result.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
