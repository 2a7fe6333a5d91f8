"""What the model wrote: trainer.rollout_data_dir / validation_data_dir dumps and log_val_generations tables."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from algorithms_numpy_reference import grpo
from rich.console import Console
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.observe.generation_log import GenerationDump, generation_records, readable_text
from rlloom.core_rl.observe.trackers import ConsoleTracker, JSONLTracker, MultiTracker, TensorBoardTracker
from rlloom.core_rl.tiny import char_tokenizer
from rlloom.core_rl.trainer import Trainer


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected_reward(response: str, ground_truth: str) -> float:
    """tiny_run.digit_reward written out again: exact match plus half the share of digit characters."""
    text = response.strip()
    digits = sum(c.isdigit() for c in text) / len(text) if text else 0.0
    return float(text == ground_truth) + 0.5 * digits


def test_trainer_dumps_every_step_and_validation_and_shows_samples(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    screen = io.StringIO()
    console = ConsoleTracker(2, console=Console(file=screen, width=200))
    overrides = [
        "trainer.total_steps=2",
        "trainer.val_every=2",
        "trainer.val_before_train=true",
        "trainer.log_val_generations=2",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
        f"trainer.validation_data_dir={tmp_path / 'validation'}",
    ]
    val_rows = sum_rows(3, seed=5)
    trainer = Trainer(
        tiny_config(tiny_model_dir, out, overrides),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=digit_reward,
        train_data=sum_rows(8),
        val_data=val_rows,
        trackers=[JSONLTracker(out / "metrics.jsonl"), console],
    )
    trainer.fit()

    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl"]
    metrics = {r["step"]: r for r in read_lines(out / "metrics.jsonl") if "reward/mean" in r}
    for step in (1, 2):
        records = read_lines(tmp_path / "rollouts" / f"{step}.jsonl")
        assert len(records) == 4 * 4  # train_batch_size prompts x rollout.n samples
        for record in records:
            assert record["step"] == step and record["split"] == "train"
            a, b = record["prompt"].split("=")[0][-3:].split("+")  # the chat-templated prompt holds "a+b="
            assert int(a) + int(b) == int(record["ground_truth"])
            assert record["reward"] == pytest.approx(expected_reward(record["response"], record["ground_truth"]))
            assert set(record["reward_components"]) == {"exact", "digits"}
            assert record["reward_error"] is None
        rewards = [r["reward"] for r in records]
        assert sum(rewards) / len(rewards) == pytest.approx(metrics[step]["reward/mean"], abs=1e-5)
        # GRPO: the advantage every token of a response carries is its group-normalised reward
        reference = grpo(rewards, [r["group_id"] for r in records])
        for record, want in zip(records, reference, strict=True):
            if record["sampled_tokens"]:
                assert record["advantage"] == pytest.approx(want, abs=1e-4)

    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == ["0.jsonl", "2.jsonl"]
    for step in (0, 2):
        records = read_lines(tmp_path / "validation" / f"{step}.jsonl")
        assert [r["ground_truth"] for r in records] == [row["reward_model"]["ground_truth"] for row in val_rows]
        assert all(r["split"] == "validation" and r["advantage"] is None for r in records)
        for record in records:
            assert record["reward"] == pytest.approx(expected_reward(record["response"], record["ground_truth"]))

    shown = screen.getvalue()
    assert "val/generations, step 0" in shown and "val/generations, step 2" in shown
    first, second, third = (row["prompt"][0]["content"] for row in val_rows)
    assert first in shown and second in shown and third not in shown  # log_val_generations=2: the first two rows


def test_a_resumed_run_drops_the_abandoned_attempts_step_files(tmp_path: Path) -> None:
    for name in ("1.jsonl", "2.jsonl", "3.jsonl", "10.jsonl", "notes.txt", "2.jsonl.bak"):
        (tmp_path / name).write_text("{}\n")
    GenerationDump(tmp_path, start_step=2)  # the checkpoint was at step 2: steps 3 and 10 will be redone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.jsonl", "2.jsonl", "2.jsonl.bak", "notes.txt"]
    GenerationDump(tmp_path, start_step=0)  # a fresh start keeps no step file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.jsonl.bak", "notes.txt"]


def test_a_dump_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rollouts").write_text("")
    with pytest.raises(NotADirectoryError, match="rollouts is a file"):
        GenerationDump(tmp_path / "rollouts", start_step=0)


def test_repeated_special_tokens_are_written_once_with_their_count() -> None:
    tok = char_tokenizer()
    pad, eos = int(tok.pad_token_id), int(tok.eos_token_id)
    ids = (
        tok("ab", add_special_tokens=False)["input_ids"]
        + [pad, pad, pad]
        + tok("c", add_special_tokens=False)["input_ids"]
        + [eos]
    )
    assert readable_text(tok, ids) == f"ab{tok.pad_token}x3c{tok.eos_token}"
    assert readable_text(tok, []) == ""


def test_records_keep_scoring_errors_and_non_finite_numbers_as_json(tmp_path: Path) -> None:
    tok = char_tokenizer()
    traj = Trajectory(
        prompt_ids=tok("1+1=", add_special_tokens=False)["input_ids"],
        response_ids=[],
        loss_mask=[],
        ground_truth="2",
        reward=0.0,
        reward_error="no scorer for data_source 'x'",
        metrics={"turns": 1.0, "latency": float("inf")},
    )
    (record,) = generation_records([traj], tok, step=3, split="train", advantages=[None])
    assert record["prompt"] == "1+1=" and record["response"] == ""
    assert record["reward_error"] == "no scorer for data_source 'x'"
    assert record["metrics"] == {"turns": 1.0, "latency": "inf"}
    assert record["advantage"] is None and record["sampled_tokens"] == 0
    GenerationDump(tmp_path, start_step=0).write(3, [record])
    assert read_lines(tmp_path / "3.jsonl") == [record]
    with pytest.raises(ValueError, match="2 advantages for 1 trajectories"):
        generation_records([traj], tok, step=3, split="train", advantages=[0.1, 0.2])


def test_tensorboard_shows_the_samples_as_a_markdown_table(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = MultiTracker([TensorBoardTracker(tmp_path / "tb"), JSONLTracker(tmp_path / "metrics.jsonl")])
    records = [{"data_source": "toy", "prompt": "2+2=", "response": "4 | four\nok", "ground_truth": "4", "reward": 1.0}]
    tracker.log_generations(records, 5, title="val/generations")
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    (event,) = events.Tensors("val/generations/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 5
    assert text.splitlines()[0] == "| data_source | prompt | response | ground_truth | reward |"
    assert '| toy | 2+2= | 4 \\| four<br>ok | "4" | 1 |' in text
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # the metrics file takes no samples
