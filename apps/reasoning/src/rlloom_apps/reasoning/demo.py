"""`reasoning demo`: train a tiny model end to end on CPU with the real rlloom components.

Wiring only: a character-level Qwen2 (rlloom.core_rl.tiny) gets a few seconds of supervised warm-up on
digit-string reversal, then GRPO through rlloom.core_rl's Trainer, sampling with rlloom.rollout's HFEngine on
the actor's own module (no weight copy) and rewarded by rlloom.rewards' math scorer. Validation on held-out
pairs runs before training and every few steps; the run folder holds config.yaml, metrics.jsonl and
checkpoints, and the end of the run prints held-out reward before vs after.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rlloom_apps.reasoning.toy_task import answer_of, reverse_splits
from rlloom_apps.reasoning.warmup import supervised_warmup

from rlloom.core_rl.actor import PolicyActor
from rlloom.core_rl.collection import score, single_turn_collector
from rlloom.core_rl.config import RLConfig, load_config
from rlloom.core_rl.generation import SamplingParams
from rlloom.core_rl.protocols import RewardOutput
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.trajectory import Trajectory
from rlloom.rewards.math import math_scorer
from rlloom.rollout.hf_engine import HFEngine

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"


@dataclass(frozen=True)
class DemoSettings:
    """What the demo varies besides the trainer config: model size, warm-up length and the data split."""

    hidden_size: int = 64
    num_layers: int = 2
    warmup_steps: int = 600
    warmup_lr: float = 3e-3
    warmup_rows: int = 600  # training strings the warm-up sees (GRPO sees all of them)
    length: int = 3
    held_out: int = 64


def demo_config(model_dir: Path, output_dir: Path, steps: int | None, seed: int, overrides: Sequence[str]) -> RLConfig:
    """configs/demo.yaml, then the demo's own paths, seed and --steps, then the user's dotted overrides (which win)."""
    own = [f"model.path={model_dir}", f"trainer.output_dir={output_dir}", f"trainer.seed={seed}"]
    own.append("trainer.resume=never")  # the demo always starts fresh
    if steps is not None:
        own.append(f"trainer.total_steps={steps}")
    return load_config(DEMO_CONFIG, [*own, *overrides])


def math_reward(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    """rlloom.rewards' math scorer on each response: 1.0 when the final number equals the sum."""
    outputs = []
    for traj in trajectories:
        result = math_scorer(traj.response_text, traj.ground_truth)
        outputs.append(RewardOutput(score=result.score, components={"correct": result.score}, error=result.error))
    return outputs


@dataclass(frozen=True)
class DemoResult:
    """Where the run went and what it showed (held-out rewards are greedy, as the trainer validates)."""

    output_dir: Path
    untrained_reward: float  # the randomly initialised model
    before_reward: float  # after the warm-up, before GRPO (the trainer's step-0 validation)
    after_reward: float  # after the last GRPO step
    val_curve: list[tuple[int, float]]  # (step, held-out reward)
    train_curve: list[tuple[int, float]]  # (step, mean sampled reward)
    seconds: float


def default_output_dir() -> Path:
    return Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"


def run_demo(
    *,
    output_dir: Path | None = None,
    steps: int | None = None,
    seed: int = 0,
    overrides: Sequence[str] = (),
    settings: DemoSettings = DemoSettings(),
) -> DemoResult:
    """Warm up, then GRPO with validation; returns the held-out rewards before and after."""
    started = time.perf_counter()
    output_dir = output_dir or default_output_dir()
    if (output_dir / "checkpoints").exists():
        raise FileExistsError(f"{output_dir} already holds a run; pass a new --out (the demo always starts fresh)")
    model_dir = output_dir / "warmup_model"
    config = demo_config(model_dir, output_dir, steps, seed, overrides)  # bad overrides fail before any work
    torch.manual_seed(seed)
    train_rows, held_out_rows = reverse_splits(settings.length, settings.held_out)

    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers, seed=seed)
    untrained = _greedy_reward(HFEngine(model, tokenizer), held_out_rows, config.rollout.max_tokens)
    warm_rows = train_rows[: settings.warmup_rows]
    losses = supervised_warmup(
        model,
        tokenizer,
        [(row["prompt"], answer_of(row)) for row in warm_rows],
        steps=settings.warmup_steps,
        lr=settings.warmup_lr,
        seed=seed,
    )
    if losses:
        print(f"warm-up: {len(losses)} steps on {len(warm_rows)} strings, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    # the warmed-up model is GRPO's starting point and (when a KL term is on) its reference policy
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    trainer = Trainer(
        config,
        engine=HFEngine(model, tokenizer),
        reward_fn=math_reward,
        train_data=train_rows,
        val_data=held_out_rows,
    )
    # Trainer builds the actor itself and takes its engine up front, so the engine that samples from the actor's
    # own module (no copy, no per-step weight transfer) can only be bound once the trainer exists.
    actor = trainer.parts.actor
    if not isinstance(actor, PolicyActor):
        raise TypeError(f"the demo shares the in-process actor's module, got a {type(actor).__name__} actor")
    engine = HFEngine(actor.model, trainer.parts.tokenizer)
    trainer.engine = engine
    trainer.collect = single_turn_collector(engine)
    trainer.fit()
    engine.close()

    val_curve, train_curve = read_curves(output_dir / "metrics.jsonl")
    if not val_curve:
        raise RuntimeError(f"no validation was logged in {output_dir / 'metrics.jsonl'}; keep trainer.val_every > 0")
    return DemoResult(
        output_dir=output_dir,
        untrained_reward=untrained,
        before_reward=val_curve[0][1],
        after_reward=val_curve[-1][1],
        val_curve=val_curve,
        train_curve=train_curve,
        seconds=time.perf_counter() - started,
    )


def _greedy_reward(engine: HFEngine, rows: Sequence[dict[str, Any]], max_tokens: int) -> float:
    """Mean greedy reward on `rows`, scored exactly as the trainer's validation scores it."""
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
    trajectories = single_turn_collector(engine)(rows, greedy, "untrained")
    score(trajectories, math_reward)
    return sum(t.reward or 0.0 for t in trajectories) / len(trajectories)


def read_curves(metrics_path: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, held-out reward) and (step, training reward) from the trainer's metrics.jsonl."""
    val: list[tuple[int, float]] = []
    train: list[tuple[int, float]] = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if "val/reward/mean" in record:
            val.append((int(record["step"]), float(record["val/reward/mean"])))
        if "reward/mean" in record:
            train.append((int(record["step"]), float(record["reward/mean"])))
    return val, train
