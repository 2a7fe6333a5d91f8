"""`vlm-geo3k demo`: a tiny vision-language model learns to read a colour from pixels, on CPU, with GRPO.

Wiring only. The pictures are synthetic (`synthetic.py`: one coloured square on noise, 56 x 56 pixels, 4 image
tokens); the question is the same for every picture, so the answer is only in the image. The steps:
1. a randomly initialised Qwen2.5-VL (`rlloom.multimodal.tiny`, 0.17M parameters) gets a short supervised
   warm-up (`rlloom.core_rl.workers.supervised`, through the actor's own forward with pixels and M-RoPE
   positions) that stops as soon as it names the colour of some training pictures, leaving the rest to RL;
2. GRPO through `vlm-geo3k train`'s wiring: `rlloom.multimodal.vision_collector` rollouts from an `HFEngine` on
   the actor's module, rewarded by the math checker on the `\\boxed{}` answer (`rlloom.rewards`), validated
   greedily on held-out pictures before training and every few steps.
The run folder gets the pictures, the rows, config.yaml, metrics.jsonl, the warm-up model, a checkpoint,
before_after.md, summary.json and the curve.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rlloom_apps.vlm_geo3k.settings import load_train_config
from rlloom_apps.vlm_geo3k.synthetic import make_pictures, to_rows
from rlloom_apps.vlm_geo3k.train import run_train
from torch import nn
from transformers import AutoModelForImageTextToText

from rlloom.core_rl.config import demo_overrides
from rlloom.core_rl.contracts import SamplingParams, Trajectory
from rlloom.core_rl.data import ground_truth
from rlloom.core_rl.observe import read_curves
from rlloom.core_rl.run import fresh_run_dir, latest_checkpoint
from rlloom.core_rl.workers import supervised_train
from rlloom.multimodal.collection import row_vision_inputs, vision_collector
from rlloom.multimodal.qwen_vl import QwenVLProcessing
from rlloom.multimodal.tiny import qwen_vl_char_tokenizer, tiny_qwen2_5_vl
from rlloom.rewards.math import math_scorer
from rlloom.rollout import HFEngine

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"
SCORERS = {"synthetic_color": "math"}  # the math checker compares the \boxed{} text with the colour


@dataclass(frozen=True)
class DemoSettings:
    """What the demo varies besides the trainer config: data sizes and the warm-up."""

    train_pictures: int = 400
    held_out: int = 64
    warmup_max_steps: int = 600  # upper bound; the warm-up usually stops far earlier (warmup_target)
    warmup_lr: float = 1e-3
    warmup_batch: int = 16
    warmup_target: float = 0.35  # stop once this share of the probe pictures is named right (greedy)
    warmup_check_every: int = 10
    probe_rows: int = 64  # training pictures the warm-up probes (never held-out ones)


@dataclass(frozen=True)
class DemoResult:
    """Where the run went and what it showed (held-out accuracy is greedy, as the trainer validates)."""

    output_dir: Path
    untrained: float  # held-out greedy accuracy of the randomly initialised model
    before_greedy: float  # after the warm-up, before GRPO
    after_greedy: float  # after the last GRPO step
    before_sampled: float  # the trainer's first validation: sampled as in training (T=1, 4 per picture)
    after_sampled: float  # its last validation
    warmup_steps: int
    val_curve: list[tuple[int, float]]  # (step, held-out accuracy of sampled answers)
    train_curve: list[tuple[int, float]]  # (step, mean sampled reward)
    seconds: float


def run_demo(
    *,
    output_dir: Path | None = None,
    steps: int | None = None,
    seed: int = 0,
    overrides: Sequence[str] = (),
    settings: DemoSettings = DemoSettings(),
) -> DemoResult:
    """Make the pictures, warm up, then GRPO with validation; returns held-out accuracy before and after."""
    started = time.perf_counter()
    output_dir = fresh_run_dir(output_dir, "vlm-demo")
    model_dir, tokenizer_dir = output_dir / "warmup_model", output_dir / "warmup_tokenizer"
    own = demo_overrides(
        model_path=model_dir, output_dir=output_dir, seed=seed, steps=steps, tokenizer_path=tokenizer_dir
    )
    config, vision = load_train_config(DEMO_CONFIG, [*own, *overrides])  # bad overrides fail before any work
    max_tokens = config.rollout.max_tokens

    train_rows = to_rows(make_pictures(settings.train_pictures, seed), output_dir / "images", "train")
    held_out_rows = to_rows(make_pictures(settings.held_out, seed + 10_000), output_dir / "images", "held_out")
    for name, rows in (("train", train_rows), ("held_out", held_out_rows)):
        (output_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    torch.manual_seed(seed)
    tokenizer = qwen_vl_char_tokenizer()
    model = tiny_qwen2_5_vl(tokenizer, seed=seed)
    processing = vision.processing(model.config.vision_config)
    untrained = held_out_accuracy(model, tokenizer, held_out_rows, processing, max_tokens)

    demonstrations = [demonstration(row, tokenizer, processing) for row in train_rows]
    probe = train_rows[: settings.probe_rows]
    probe_accuracy: list[float] = []

    def warm_enough(step: int) -> bool:
        probe_accuracy.append(held_out_accuracy(model, tokenizer, probe, processing, max_tokens))
        return probe_accuracy[-1] >= settings.warmup_target

    losses = supervised_train(
        model,
        demonstrations,
        pad_token_id=int(tokenizer.pad_token_id),
        steps=settings.warmup_max_steps,
        batch_size=settings.warmup_batch,
        lr=settings.warmup_lr,
        seed=seed,
        stop=warm_enough,
        check_every=settings.warmup_check_every,
    )
    if losses:
        reached = f", {probe_accuracy[-1]:.2f} right on {len(probe)} training pictures" if probe_accuracy else ""
        print(f"warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}{reached}")
    model.save_pretrained(model_dir)  # GRPO's starting point
    tokenizer.save_pretrained(tokenizer_dir)  # apart: AutoTokenizer reads a model folder as Qwen2's BPE
    before_greedy = held_out_accuracy(model, tokenizer, held_out_rows, processing, max_tokens)

    run_train(
        config,
        vision,
        train_data=output_dir / "train.jsonl",
        val_data=output_dir / "held_out.jsonl",
        score_workers=1,
        scorers=SCORERS,
    )
    val_curve, train_curve = read_curves(output_dir / "metrics.jsonl")
    final = latest_checkpoint(output_dir / "checkpoints")
    assert final is not None, "the trainer saves a checkpoint after its last step"
    trained = AutoModelForImageTextToText.from_pretrained(final).eval()
    result = DemoResult(
        output_dir=output_dir,
        untrained=untrained,
        before_greedy=before_greedy,
        after_greedy=held_out_accuracy(trained, tokenizer, held_out_rows, processing, max_tokens),
        before_sampled=val_curve[0][1],
        after_sampled=val_curve[-1][1],
        warmup_steps=len(losses),
        val_curve=val_curve,
        train_curve=train_curve,
        seconds=time.perf_counter() - started,
    )
    write_summary(result)
    return result


def demonstration(row: dict[str, Any], tokenizer: Any, processing: QwenVLProcessing) -> Trajectory:
    """The picture's prompt (pixels, expanded image tokens, M-RoPE positions) and the right answer as response."""
    inputs = row_vision_inputs(row, tokenizer, processing)
    answer = tokenizer(f"\\boxed{{{ground_truth(row)}}}", add_special_tokens=False)["input_ids"]
    answer = [*answer, int(tokenizer.eos_token_id)]
    return Trajectory(
        prompt_ids=list(inputs.input_ids),
        response_ids=answer,
        loss_mask=[1] * len(answer),
        multimodal=inputs.engine_inputs(),
    )


def held_out_accuracy(
    model: nn.Module, tokenizer: Any, rows: Sequence[dict[str, Any]], processing: QwenVLProcessing, max_tokens: int
) -> float:
    """Greedy answers through HFEngine and the vision collector, scored as the trainer's validation scores them."""
    engine = HFEngine(model, tokenizer)
    try:
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
        trajectories = vision_collector(tokenizer, processing)(engine)(rows, greedy, "eval")
    finally:
        engine.close()
    return sum(math_scorer(t.response_text, t.ground_truth).score for t in trajectories) / len(trajectories)


def before_after_table(result: DemoResult) -> str:
    """Held-out accuracy, sampled as in training (what GRPO optimises) and greedy."""
    return "\n".join(
        [
            "| held-out pictures: colour named right | sampled (T=1, 4 each) | greedy |",
            "|---|---|---|",
            f"| untrained | | {result.untrained:.2f} |",
            f"| after the warm-up ({result.warmup_steps} steps) | {result.before_sampled:.2f} "
            f"| {result.before_greedy:.2f} |",
            f"| after GRPO ({result.val_curve[-1][0]} steps) | **{result.after_sampled:.2f}** "
            f"| {result.after_greedy:.2f} |",
        ]
    )


def write_summary(result: DemoResult) -> None:
    """before_after.md (the table the CLI prints) and summary.json in the run folder."""
    (result.output_dir / "before_after.md").write_text(before_after_table(result) + "\n")
    summary = {
        "untrained": result.untrained,
        "before_grpo": {"sampled": result.before_sampled, "greedy": result.before_greedy},
        "after_grpo": {"sampled": result.after_sampled, "greedy": result.after_greedy},
        "warmup_steps": result.warmup_steps,
        "val_curve": result.val_curve,
        "seconds": round(result.seconds, 1),
    }
    (result.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


__all__ = ["DemoResult", "DemoSettings", "run_demo"]
