"""DAPO's dynamic sampling under trainer.mode=one_step_off on the tiny model: the background job runs the
synchronous trainer's rounds itself (keep the groups with signal, draw more rows, up to max_rounds), every round
under the weights the batch started with, and a resume mid-run trains the same rows as the uninterrupted run.

The reward makes the signal known in advance (test_async_dynamic_sampling.py's: an even-sum row's samples score
0, 1, 2, 3, an odd-sum row's all 0), so which rows each step trains is worked out here from the loader's draw order
alone: per step, batches of 4 rows until 4 even-sum rows are in hand or max_rounds is reached."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_async_dynamic_sampling import SignalOnEvenSums
from test_async_rl import distinct_rows, metric_lines
from test_off_policy import WeightRecordingEngine, checksum
from tiny_run import SamplingEngine, tiny_config

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import PromptLoader
from rlloom.core_rl.run.checkpoint import load_trainer_state
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import PolicyActor

BATCH = 4  # tiny_grpo.yaml's data.train_batch_size
OFF_POLICY_DS = ["trainer.mode=one_step_off", "actor.warmup_steps=0", "algorithm.dynamic_sampling.max_rounds=4"]


class GroupRecordingReward(SignalOnEvenSums):
    """The parity reward, noting each group's prompt and the step of every call (`s{step}r{round}-{i}` group ids)."""

    def __init__(self, signal: bool = True) -> None:
        super().__init__(signal)
        self.prompt_of: dict[str, str] = {}
        self.call_steps: list[int] = []

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
        for traj in trajectories:
            assert traj.prompt_messages is not None
            self.prompt_of[traj.group_id] = str(traj.prompt_messages[0]["content"])
        self.call_steps.append(int(trajectories[0].group_id.split("r")[0][1:]))
        return super().__call__(trajectories)


@dataclass
class Expected:
    prompts: list[str]  # the rows the step trains, in draw order
    rounds: int
    seen: int  # groups drawn for the step
    signal: int  # of them, those with signal (even sums)
    loader_after: dict[str, Any]  # the loader's state once the step's rows are drawn


def expected_steps(trainer: Trainer, steps: int, *, max_rounds: int = 4) -> list[Expected]:
    """By hand from the loader's order (a loader of the run's rows and seed): each step draws batches until BATCH
    even-sum rows are in hand, or max_rounds batches."""
    rows, cfg = distinct_rows(12), trainer.cfg
    loader = PromptLoader(rows, BATCH, shuffle=cfg.data.shuffle, seed=cfg.trainer.seed)
    out = []
    for _ in range(steps):
        kept: list[int] = []
        seen = rounds = 0
        while rounds < max_rounds and len(kept) < BATCH:
            rounds += 1
            ids = loader.next_batch_ids()
            seen += len(ids)
            kept += [i for i in ids if int(rows[i]["reward_model"]["ground_truth"]) % 2 == 0]
        prompts = [str(rows[i]["prompt"][0]["content"]) for i in kept[:BATCH]]
        out.append(Expected(prompts, rounds, seen, len(kept), loader.state_dict()))
    return out


def trained_prompts(dump: Path, reward: GroupRecordingReward, step: int) -> list[str]:
    """The rows step `step` trained on (by the rollout dump's group ids), in group order."""
    groups: list[str] = []
    for record in map(json.loads, (dump / f"{step}.jsonl").read_text().splitlines()):
        if record["group_id"] not in groups:
            groups.append(record["group_id"])
    return [reward.prompt_of[g] for g in groups]


def make_trainer(model_dir: Path, out: Path, overrides: list[str], reward: GroupRecordingReward, **kw: Any) -> Trainer:
    return Trainer(
        tiny_config(model_dir, out, [*OFF_POLICY_DS, *overrides]),
        engine=kw.pop("engine", None) or SamplingEngine(model_dir),
        reward_fn=reward,
        train_data=distinct_rows(12),  # 7 even sums, 5 odd
    )


def test_only_groups_with_signal_train_filled_from_later_rounds_one_step_off(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine, reward, run = WeightRecordingEngine(tiny_model_dir), GroupRecordingReward(), tmp_path / "run"
    overrides = ["trainer.total_steps=3", "trainer.save_every=0", f"trainer.rollout_data_dir={run}/dump"]
    trainer = make_trainer(tiny_model_dir, run, overrides, reward, engine=engine)
    actor = trainer.parts.actor
    assert isinstance(actor, PolicyActor)
    weights, lines = [checksum(actor.model)], []  # θ0, then θ1, θ2, θ3 after each step
    trainer.weights.sync()  # what fit() does first
    try:
        for step in (1, 2, 3):
            trainer.step = step
            lines.append(trainer.train_step())
            weights.append(checksum(actor.model))
        trainer.weights.refresh()
    finally:
        assert trainer.rollouts is not None
        trainer.rollouts.close()
    expected = expected_steps(trainer, 3)
    assert max(e.rounds for e in expected) >= 2  # the data makes some batch need a later round
    for step, (line, want) in enumerate(zip(lines, expected, strict=True), start=1):
        assert trained_prompts(run / "dump", reward, step) == want.prompts
        assert line["dynamic_sampling/rounds"] == want.rounds
        assert line["dynamic_sampling/kept_group_frac"] == pytest.approx(want.signal / want.seen)
        assert line["dynamic_sampling/dropped_groups"] == want.seen - want.signal
        assert line["reward/mean"] == 1.5  # (0 + 1 + 2 + 3) / 4: no zero group among the trained
        assert "dynamic_sampling/skipped_update" not in line
    # every round of step s's batch sampled with θ(s-2) (step 1 and 2: θ0), the batch trains one update later
    assert reward.call_steps == [s for s, e in enumerate(expected, start=1) for _ in range(e.rounds)]
    sampled = [weights[max(s - 2, 0)] for s in reward.call_steps]
    assert engine.sampled_with == pytest.approx(sampled, rel=1e-12)
    assert [line["rollout/policy_lag"] for line in lines] == [0.0, 1.0, 1.0]
    assert len(set(weights)) == 4  # every step updated


def test_a_resume_mid_run_trains_the_same_rows_one_step_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Checkpoint 2 is saved while step 3's rounds run in the background; a resume from it draws them again."""
    steps = ["trainer.total_steps=6", "trainer.save_every=1", "trainer.keep_last=6"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    whole_reward, resumed_reward = GroupRecordingReward(), GroupRecordingReward()
    trainer = make_trainer(tiny_model_dir, whole, [*steps, f"trainer.rollout_data_dir={whole}/dump"], whole_reward)
    trainer.fit()
    resume = [*steps, f"trainer.rollout_data_dir={resumed}/dump", f"trainer.resume={whole}/checkpoints/step_2"]
    make_trainer(tiny_model_dir, resumed, resume, resumed_reward).fit()
    expected = expected_steps(trainer, 6)
    for step in range(1, 7):
        assert trained_prompts(whole / "dump", whole_reward, step) == expected[step - 1].prompts
    for step in range(3, 7):
        assert trained_prompts(resumed / "dump", resumed_reward, step) == expected[step - 1].prompts
    assert not (resumed / "dump" / "2.jsonl").exists()
    # the checkpoint's loader stands after step 2's rows: step 3's, in flight at the save, are drawn again
    saved = load_trainer_state(whole / "checkpoints" / "step_2")["loader"]
    assert (saved["epoch"], saved["position"]) == (
        expected[1].loader_after["epoch"],
        expected[1].loader_after["position"],
    )
    assert [line["dynamic_sampling/rounds"] for line in metric_lines(resumed)] == [e.rounds for e in expected[2:]]


def test_without_any_signal_each_step_skips_its_update_after_max_rounds(tiny_model_dir: Path, tmp_path: Path) -> None:
    reward, run = GroupRecordingReward(signal=False), tmp_path / "run"
    overrides = ["trainer.total_steps=2", "trainer.save_every=0", "algorithm.dynamic_sampling.max_rounds=2"]
    make_trainer(tiny_model_dir, run, overrides, reward).fit()
    lines = metric_lines(run)
    assert len(lines) == 2
    for line in lines:
        assert line["dynamic_sampling/skipped_update"] == 1.0
        assert line["dynamic_sampling/rounds"] == 2.0
        assert line["dynamic_sampling/kept_group_frac"] == 0.0
        assert line["dynamic_sampling/dropped_groups"] == 8.0  # 2 rounds x 4 groups, none with signal
        assert line["rollout/policy_lag"] == 0.0  # no update: the engine's weights are the trainer's
    # 2 steps x 2 rounds x 4 groups (even sums scored 0 as well), and no background round for a step 3
    assert reward.call_steps == [1, 1, 2, 2]
    assert reward.groups[True] + reward.groups[False] == 16


def test_the_config_accepts_dynamic_sampling_one_step_off_and_still_refuses_filter_solved() -> None:
    base = ["model.path=/m", "trainer.mode=one_step_off", "algorithm.dynamic_sampling.max_rounds=4"]
    cfg = load_config(None, base)
    assert cfg.trainer.mode == "one_step_off" and cfg.algorithm.dynamic_sampling is not None
    assert cfg.algorithm.dynamic_sampling.max_rounds == 4
    for key in ("data.filter_solved=true", "data.filter_unsolved=true"):
        with pytest.raises(ConfigError, match=r"trainer\.one_step_off_policy: cannot run with data\.filter_solved"):
            load_config(None, [*base, key])
