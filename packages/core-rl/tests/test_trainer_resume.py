"""End to end on the tiny Qwen2: a run killed with SIGKILL after a checkpoint and resumed gives the same
per-step metrics as an uninterrupted run, bitwise; epoch boundaries and finished runs resume correctly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import SamplingEngine, digit_reward, run, sum_rows, tiny_config
from transformers import AutoModelForCausalLM

from rlloom.core_rl.trainer import RunFinished, Trainer

VOLATILE = ("timing/", "perf/")  # wall-clock measurements differ between any two runs


def read_metrics(output_dir: Path) -> list[dict[str, float]]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)} for line in lines]


def test_sigkill_then_resume_matches_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    steps = ["trainer.total_steps=4", "trainer.save_every=2"]
    reference = tmp_path / "uninterrupted"
    run(tiny_model_dir, reference, steps)
    expected = read_metrics(reference)
    assert [m["step"] for m in expected] == [1, 2, 3, 4]

    killed = tmp_path / "killed"
    script = Path(__file__).parent / "tiny_run.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tiny_model_dir), str(killed), *steps],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latest = killed / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the child finished before it could be killed"
    assert latest.read_text() == "step_2"

    run(tiny_model_dir, killed, steps)  # resume=auto picks up the latest checkpoint
    assert read_metrics(killed) == expected

    # the final checkpoint is a Hugging Face model directory
    final = AutoModelForCausalLM.from_pretrained(killed / "checkpoints" / "step_4")
    assert final.config.model_type == "qwen2"


def test_resume_at_epoch_boundary_and_finished_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "epochs"
    # 8 rows / 4 prompts per step = 2 steps per epoch; stop exactly at the end of epoch 1
    run(tiny_model_dir, out, ["trainer.total_steps=2"])
    with pytest.raises(RunFinished, match="already finished") as info:
        Trainer(
            tiny_config(tiny_model_dir, out, ["trainer.total_steps=2"]),
            engine=SamplingEngine(tiny_model_dir),
            reward_fn=digit_reward,
            train_data=sum_rows(8),
        )
    assert info.value.code != 0
    # asking for more steps continues into the second epoch instead of exiting having trained nothing
    run(tiny_model_dir, out, ["trainer.total_steps=3"])
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["train/epoch"] for m in metrics] == [0.0, 0.0, 1.0]


def test_a_resumed_run_trains_at_the_config_it_resumes_with(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`actor.lr` / `actor.weight_decay` changed on resume take effect (the resume warning lists them as changes);
    the checkpoint restored the old ones over them, so step 3 trained at the old lr while config.yaml said the new.
    Adam's moments and the schedule's position still come from the checkpoint."""
    out = tmp_path / "lr"
    constant = ["actor.lr_schedule=constant", "actor.warmup_steps=0"]
    run(tiny_model_dir, out, [*constant, "trainer.total_steps=2", "actor.lr=3e-4", "actor.weight_decay=0.01"])
    trainer = Trainer(
        tiny_config(tiny_model_dir, out, [*constant, "trainer.total_steps=3", "actor.lr=1e-4", "actor.weight_decay=0"]),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=digit_reward,
        train_data=sum_rows(8),
    )
    optimizer = trainer.parts.actor.optimizer  # type: ignore[union-attr]
    assert [g["lr"] for g in optimizer.param_groups] == [1e-4] and optimizer.param_groups[0]["weight_decay"] == 0.0
    assert all(int(s["step"]) == 8 for s in optimizer.state.values())  # 2 steps x 2 epochs x 2 mini-batches, kept
    trainer.fit()
    assert [m["actor/lr"] for m in read_metrics(out)] == [3e-4, 3e-4, 1e-4]


def test_the_last_steps_validation_is_logged_before_its_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that dies while writing its last checkpoint has logged that step's validation: with the save first,
    a kill after it lost the validation for good, since a resume finds the run finished."""
    out = tmp_path / "run"
    overrides = [
        "trainer.total_steps=2",
        "trainer.val_every=2",
        "trainer.save_every=0",
        "trainer.val_before_train=false",
    ]
    config = tiny_config(tiny_model_dir, out, overrides)
    trainer = Trainer(
        config,
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=digit_reward,
        train_data=sum_rows(8),
        val_data=sum_rows(4, seed=1),
    )

    def killed_while_saving() -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "save", killed_while_saving)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert [m["step"] for m in read_metrics(out) if "val/reward/mean" in m] == [2]
