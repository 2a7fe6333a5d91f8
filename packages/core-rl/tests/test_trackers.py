"""Trackers: metrics.jsonl (one line per step, trimmed on resume), console, TensorBoard, W&B offline."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from rlloom.core_rl.contracts.protocols import Tracker
from rlloom.core_rl.observe.trackers import ConsoleTracker, JSONLTracker, MultiTracker, TensorBoardTracker


def test_jsonl_lines_and_resume_trimming(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tracker = JSONLTracker(path)
    for step in (1, 2, 3):
        tracker.log({"reward/mean": step / 10, "bad": math.nan}, step=step)
    tracker.close()
    with path.open("a") as handle:
        handle.write('{"step": 4, "rew')  # torn by a crash mid-write
    resumed = JSONLTracker(path, resume_step=2)  # the checkpoint was at step 2
    resumed.log({"reward/mean": 0.9}, step=3)
    resumed.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0] == {"step": 1, "reward/mean": 0.1, "bad": "nan"}
    assert records[2]["reward/mean"] == 0.9


def test_jsonl_fresh_start_drops_an_earlier_attempts_step_zero(tmp_path: Path) -> None:
    """A run that crashed before its first checkpoint (trainer.val_before_train logged step 0) and starts again
    (resume_step=0) leaves one step-0 record, the new one, as the TensorBoard tracker does."""
    path = tmp_path / "metrics.jsonl"
    tracker = JSONLTracker(path)
    tracker.log({"val/reward/mean": 0.1}, step=0)
    tracker.log({"reward/mean": 0.2}, step=1)
    tracker.close()
    again = JSONLTracker(path, resume_step=0)
    again.log({"val/reward/mean": 0.3}, step=0)
    again.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 0, "val/reward/mean": 0.3}]
    assert not list(tmp_path.glob(".*.tmp"))


def test_console_prints_a_compact_line() -> None:
    buffer = io.StringIO()
    tracker = ConsoleTracker(total_steps=3, console=Console(file=buffer, width=200))
    tracker.log({"reward/mean": 0.25, "actor/grad_norm": 1.5, "timing/step_s": 2.0}, step=1)
    tracker.close()
    assert "step 1 | reward 0.25 | gnorm 1.5" in buffer.getvalue()


def test_tensorboard_event_file_is_readable(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(tmp_path)
    multi = MultiTracker([tracker])
    assert isinstance(multi, Tracker) and isinstance(tracker, Tracker)
    multi.log({"reward/mean": 0.5}, step=1)
    multi.log({"reward/mean": 0.75}, step=2)
    multi.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    from rlloom.core_rl.observe.trackers import WandbTracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = WandbTracker("rlloom-test", "run", tmp_path, {"a": 1})
    tracker.log({"reward/mean": 0.5}, step=1)
    record = {"data_source": "toy", "prompt": "2+2=", "response": "4", "ground_truth": "4", "reward": 1.0}
    tracker.log_generations([record], 1, title="val/generations")
    tracker.close()
    assert list(tmp_path.rglob("*.wandb"))


@pytest.mark.parametrize(
    ("resume_step", "expected"),
    [
        (2, [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]),
        (0, [(0, 0.0), (1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0)]),
    ],
)
def test_tensorboard_resume_purges_the_abandoned_steps(
    tmp_path: Path, resume_step: int, expected: list[tuple[int, float]]
) -> None:
    """A run killed after step 4 and resumed from its step-2 checkpoint shows steps 3 and 4 once, with the resumed
    values, as metrics.jsonl does; a fresh start (resume_step=0) in the same folder shows only the new run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = TensorBoardTracker(tmp_path)
    for step in range(5):
        first.log({"reward/mean": float(step)}, step=step)
    first.close()
    resumed = TensorBoardTracker(tmp_path, resume_step=resume_step)
    for step in range(resume_step + 1 if resume_step else 0, 5):
        resumed.log({"reward/mean": 10.0 * step}, step=step)
    resumed.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == expected


class _FailsToClose:
    """A tracker whose upload fails at exit (a remote tracker losing its connection)."""

    def log(self, metrics: object, step: int) -> None:
        return None

    def log_config(self, config: object) -> None:
        return None

    def close(self) -> None:
        raise ConnectionError("upload failed")


def test_multi_tracker_closes_every_tracker_when_one_fails(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    jsonl = JSONLTracker(path)
    both = MultiTracker([_FailsToClose(), jsonl])
    both.log({"reward/mean": 0.5}, step=1)
    with pytest.raises(ConnectionError, match="upload failed"):
        both.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1, "reward/mean": 0.5}]
    assert jsonl._file.closed  # the second tracker was closed too
