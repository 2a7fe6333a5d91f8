"""What the RL-schedule benchmarks share (bench/off_policy.py, bench/async_rl.py): the tiny Qwen2 they train, a
rule reward, addition prompts, and one timed `Trainer.fit()` with `HFEngine` on its own copy of the weights.

The runs of one benchmark differ only in their overrides (the schedule, threads, sizes), so everything else is
fixed here once and is the same for every row they compare. Not a benchmark itself: `nox -s bench` skips files
whose name starts with `_`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import Qwen2ForCausalLM

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.trainer import Trainer
from rlloom.rollout.hf.engine import HFEngine

BASE_OVERRIDES = [
    "trainer.trackers=[jsonl]",
    "trainer.device=cpu",
    "data.train_batch_size=8",
    "actor.lr=1e-4",
    "actor.warmup_steps=0",
    "algorithm.kl.use_loss=false",
]
"""What every run shares: CPU, a jsonl log, 8 prompts a step, no KL loss, a constant learning rate."""


def tiny_model(tok: Any, size: str = "128x2") -> Qwen2ForCausalLM:
    """The tiny Qwen2 of `size` ("hidden x layers"), seed 0: every run starts from the same weights."""
    hidden, layers = (int(x) for x in size.split("x"))
    return tiny_qwen2(tok, hidden_size=hidden, num_layers=layers, intermediate_size=2 * hidden, seed=0)


def save_tiny_model(folder: Path, size: str = "128x2") -> Path:
    """Save the model and its character tokenizer for `model.path`."""
    tok = char_tokenizer()
    tiny_model(tok, size).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def digit_share(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    """A rule reward: the share of digits in the response (a random model gets some signal)."""
    out = []
    for traj in trajectories:
        text = traj.response_text
        out.append(RewardOutput(score=sum(c.isdigit() for c in text) / max(len(text), 1)))
    return out


def addition_rows(count: int) -> list[dict[str, Any]]:
    """`count` prompts `a+b=` (a, b below 100, seeded)."""
    rng = random.Random(0)
    return [
        {"prompt": f"{a}+{b}=", "data_source": "toy", "reward_model": {"ground_truth": str(a + b)}}
        for a, b in ((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(count))
    ]


def timed_fit(
    model_dir: Path,
    out: Path,
    overrides: Sequence[str],
    *,
    steps: int,
    rows: int,
    size: str = "128x2",
    engine_wrapper: Callable[[HFEngine], Any] | None = None,
) -> tuple[float, dict[str, float]]:
    """(wall seconds of `fit()`, its last metrics) for `steps` steps from `model_dir`, logging to `out`; the
    engine samples its own copy of the model (synced as the schedule says), wrapped by `engine_wrapper` if given."""
    tok = char_tokenizer()
    engine = HFEngine(tiny_model(tok, size).eval(), tok)
    run = [f"model.path={model_dir}", f"trainer.output_dir={out}", f"trainer.total_steps={steps}"]
    config = load_config(None, [*run, *BASE_OVERRIDES, *overrides])
    wrapped = engine_wrapper(engine) if engine_wrapper is not None else engine
    trainer = Trainer(config, engine=wrapped, reward_fn=digit_share, train_data=addition_rows(rows))
    start = time.perf_counter()
    metrics = trainer.fit()
    wall = time.perf_counter() - start
    engine.close()
    return wall, metrics
