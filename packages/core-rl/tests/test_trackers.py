"""Trackers: metrics.jsonl (one line per step, trimmed on resume), console, TensorBoard, W&B offline."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from rlloom.core_rl.protocols import Tracker
from rlloom.core_rl.trackers import ConsoleTracker, JSONLTracker, MultiTracker, TensorBoardTracker


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
    from rlloom.core_rl.trackers import WandbTracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = WandbTracker("rlloom-test", "run", tmp_path, {"a": 1})
    tracker.log({"reward/mean": 0.5}, step=1)
    tracker.close()
    assert list(tmp_path.rglob("*.wandb"))
