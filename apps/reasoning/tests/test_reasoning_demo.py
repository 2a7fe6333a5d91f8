"""The demo end to end, shortened: warm-up, GRPO through the trainer with validation, the run folder it leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rlloom_apps.reasoning.cli import main
from rlloom_apps.reasoning.demo import DemoSettings, math_reward, run_demo
from rlloom_apps.reasoning.toy_task import reverse_row, reverse_splits
from transformers import AutoModelForCausalLM

from rlloom.core_rl.trajectory import Trajectory

SHORT = DemoSettings(hidden_size=32, warmup_steps=5, warmup_rows=16, held_out=6)
SHORT_OVERRIDES = [
    "data.train_batch_size=2",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "trainer.val_every=1",
    "trainer.save_every=0",
    "trainer.trackers=[jsonl]",
]


def test_short_demo_writes_a_complete_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_demo(output_dir=out, steps=2, seed=0, overrides=SHORT_OVERRIDES, settings=SHORT)

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "reward/mean" in r]
    val = [r for r in records if "val/reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for record in train:
        for key in ("reward/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "timing/rollout_s"):
            assert key in record, key
    assert [r["step"] for r in val] == [0, 1, 2]  # before training, then every step
    assert result.before_reward == val[0]["val/reward/mean"]
    assert result.after_reward == val[-1]["val/reward/mean"]
    assert (out / "config.yaml").read_text().count("total_steps: 2") == 1

    checkpoint = out / "checkpoints" / "step_2"
    trained = AutoModelForCausalLM.from_pretrained(checkpoint)
    warm = AutoModelForCausalLM.from_pretrained(out / "warmup_model")
    assert trained.config.hidden_size == 32
    changed = [name for name, p in trained.state_dict().items() if not torch.equal(p, warm.state_dict()[name])]
    assert changed, "two GRPO steps left the weights exactly as the warm-up did"


def test_math_reward_scores_the_reversed_string() -> None:
    row = reverse_row("482")
    assert row["reward_model"]["ground_truth"] == "284"
    trajs = [
        Trajectory(prompt_ids=[1], response_ids=[2], loss_mask=[1], response_text=text, ground_truth="284")
        for text in ("284", "482", "28", "")
    ]
    assert [r.score for r in math_reward(trajs)] == [1.0, 0.0, 0.0, 0.0]


def test_splits_are_disjoint_and_fixed() -> None:
    train, held = reverse_splits(3, 64)
    assert len(train) + len(held) == 9**3
    prompts = {r["prompt"][0]["content"] for r in train}
    assert not prompts & {r["prompt"][0]["content"] for r in held}
    assert reverse_splits(3, 64)[1] == held


def test_demo_rejects_a_mistyped_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "x"), "actor.learning_rate=1e-3"])
    assert "actor.learning_rate" in capsys.readouterr().err
