"""DAPO's dynamic sampling under trainer.mode=async on the tiny model: a group whose rewards carry no signal is
dropped as it finishes and another row takes its admission slot; the batch stays full, the staleness bound holds,
the drop budget per batch keeps a run without any signal going, and a resume neither loses nor repeats a group.

The reward makes the signal known in advance: rows whose sum is odd score 0 on every sample (no signal), rows whose
sum is even score 0, 1, 2, 3 across their group's samples (always signal)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_async_rl import ASYNC, distinct_rows, metric_lines, trained_rows, trainer_for

from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory

DYNAMIC = [*ASYNC, "algorithm.dynamic_sampling.max_rounds=4"]


def is_even(traj: Trajectory) -> bool:
    return int(str(traj.ground_truth)) % 2 == 0


class SignalOnEvenSums:
    """Scores the samples of an even-sum row 0, 1, 2 ... in the order its group is scored, an odd-sum row's 0, or
    every sample 0 with `signal=False`; counts the groups it scored by prompt and parity."""

    def __init__(self, signal: bool = True) -> None:
        self.signal = signal
        self.samples: Counter[str] = Counter()
        self.groups = Counter[bool]()  # parity (even) -> groups scored

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
        seen: Counter[str] = Counter()
        out = []
        for traj in trajectories:
            self.samples[str(traj.prompt_messages)] += 1
            if seen[traj.group_id] == 0:
                self.groups[is_even(traj)] += 1
            score = float(seen[traj.group_id]) if self.signal and is_even(traj) else 0.0
            seen[traj.group_id] += 1
            out.append(RewardOutput(score=score))
        return out


def dumped_truths(dump: Path) -> list[int]:
    """The ground truth of every trained sample in a run's rollout dump."""
    return [
        int(json.loads(line)["ground_truth"]) for path in dump.glob("*.jsonl") for line in path.read_text().splitlines()
    ]


def test_groups_without_signal_are_dropped_and_replaced(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows, reward = distinct_rows(8), SignalOnEvenSums()  # 5 even sums, 3 odd
    run = tmp_path / "run"
    overrides = [*DYNAMIC, "trainer.total_steps=3", "trainer.streaming.max_staleness=1",
                 f"trainer.rollout_data_dir={run}/dump"]  # fmt: skip
    trainer_for(tiny_model_dir, run, overrides, reward_fn=reward, train_data=rows).fit()
    lines = metric_lines(run)
    assert len(lines) == 3
    # eta 1 without an off-policy correction: the run says so once, naming the key that corrects it
    hints = [r for r in caplog.records if "off_policy_correction.method=decoupled" in r.getMessage()]
    assert len(hints) == 1 and "max_staleness=1" in hints[0].getMessage()
    trained = trained_rows(run / "dump")
    assert sum(trained.values()) == 12  # every batch full: 3 steps x 4 groups
    truths = dumped_truths(run / "dump")
    assert len(truths) == 48 and all(t % 2 == 0 for t in truths)  # only groups with signal were trained
    dropped = sum(line["dynamic_sampling/dropped_groups"] for line in lines)
    assert all(line["dynamic_sampling/unfiltered_groups"] == 0.0 for line in lines)
    # every odd-sum group scored was dropped, none trained; a dropped group never counts against the bound
    assert reward.groups[False] >= dropped >= 1
    assert reward.groups[True] >= 12
    for line in lines:
        assert line["async/staleness_max"] <= 1.0
        expected = 4 / (4 + line["dynamic_sampling/dropped_groups"])
        assert abs(line["dynamic_sampling/kept_group_frac"] - expected) < 1e-9
        assert line["reward/mean"] == 1.5  # (0 + 1 + 2 + 3) / 4: no zero group among the trained


def test_without_any_signal_the_drop_budget_keeps_the_run_going(tiny_model_dir: Path, tmp_path: Path) -> None:
    """max_rounds 2: at most (2 - 1) x 4 groups dropped per batch, then groups train as they are (sync's last
    round would train none and skip the update; async keeps the batch full, with zero advantages)."""
    reward = SignalOnEvenSums(signal=False)
    overrides = [*ASYNC, "algorithm.dynamic_sampling.max_rounds=2", "trainer.total_steps=3",
                 "trainer.streaming.max_staleness=1"]  # fmt: skip
    trainer_for(tiny_model_dir, tmp_path / "run", overrides, reward_fn=reward, train_data=distinct_rows(8)).fit()
    lines = metric_lines(tmp_path / "run")
    assert len(lines) == 3
    for line in lines:
        assert line["dynamic_sampling/unfiltered_groups"] == 4.0
        assert line["dynamic_sampling/dropped_groups"] <= 4.0
        assert line["dynamic_sampling/kept_group_frac"] == 0.0
    dropped = sum(int(line["dynamic_sampling/dropped_groups"]) for line in lines)
    assert dropped >= 4  # the first batch's budget was spent before any group was kept
    # scored = trained + dropped + whatever was still in flight when the run ended (admission: at most 2 batches)
    scored = reward.groups[True] + reward.groups[False]
    assert 12 + dropped <= scored <= 12 + dropped + 8


def test_a_resume_with_dynamic_sampling_neither_loses_nor_repeats_a_group(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = distinct_rows(12)  # 7 even sums: the kept groups are the first 24 even-sum rows in draw order
    steps = [*DYNAMIC, "trainer.total_steps=6", "trainer.streaming.max_staleness=2", "trainer.save_every=1",
             "trainer.keep_last=6"]  # fmt: skip
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    trainer_for(tiny_model_dir, whole, [*steps, f"trainer.rollout_data_dir={whole}/dump"], train_data=data,
                reward_fn=SignalOnEvenSums()).fit()  # fmt: skip
    trainer_for(
        tiny_model_dir,
        resumed,
        [*steps, f"trainer.rollout_data_dir={resumed}/dump", f"trainer.resume={whole}/checkpoints/step_2"],
        train_data=data,
        reward_fn=SignalOnEvenSums(),
    ).fit()
    uninterrupted = trained_rows(whole / "dump")
    assert sum(uninterrupted.values()) == 24
    first_part = Counter[str]()
    for step in (1, 2):
        records = [json.loads(line) for line in (whole / "dump" / f"{step}.jsonl").read_text().splitlines()]
        first_part.update({p: c // 4 for p, c in Counter(r["prompt"] for r in records).items()})
    assert first_part + trained_rows(resumed / "dump") == uninterrupted
