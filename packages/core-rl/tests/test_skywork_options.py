"""Skywork-OR1's three training options: adaptive entropy control, online filtering of solved (and unsolved)
prompts, and a multi-stage context length. Each is checked against hand-computed expectations: the controller's
coefficient sequence, the exact prompts retired by a reward that solves known prompts, and the max_tokens the
engine is actually asked for; then that a resumed run restores the controller and the filter."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tiny_run import SamplingEngine, tiny_config

from rlloom.core_rl.algorithms import AdaptiveEntropyController, applied_entropy_coef, next_entropy_coef
from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.prompt_filter import PromptFilter, prompts_to_retire
from rlloom.core_rl.trainer import Trainer

# a shorter tiny run: 2 samples of up to 6 tokens per prompt, one PPO epoch, no reference model
FAST = [
    "rollout.n=2",
    "rollout.max_tokens=6",
    "actor.ppo_epochs=1",
    "algorithm.kl.use_loss=false",
    "trainer.save_every=0",
]


class RecordingEngine(SamplingEngine):
    """The test engine, remembering for every generate call each request's prompt text and max_tokens."""

    def __init__(self, model_dir: str | Path) -> None:
        super().__init__(model_dir)
        self.calls: list[list[tuple[str, int]]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        self.calls.append([(str((r.messages or [{}])[0].get("content")), r.sampling.max_tokens) for r in requests])
        return super().generate(requests)


def kind_rows(kinds: Sequence[str]) -> list[dict[str, Any]]:
    """One row per kind, with a unique prompt `"{i}+{i}="` so requests can be traced back to rows."""
    return [
        {"prompt": f"{i}+{i}=", "reward_model": {"ground_truth": str(2 * i)}, "extra_info": {"kind": kind}}
        for i, kind in enumerate(kinds)
    ]


def kind_reward(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    """Whatever the response: 'solved' rows score 1, 'unsolved' rows 0, 'mixed' rows 1 for the first sample of
    their group only (accuracy 1/n, so never retired)."""
    first_seen: set[str] = set()
    out = []
    for traj in trajectories:
        kind = traj.extra_info["kind"]
        if kind == "mixed":
            score = float(traj.group_id not in first_seen)
            first_seen.add(traj.group_id)
        else:
            score = float(kind == "solved")
        out.append(RewardOutput(score=score))
    return out


def make_trainer(model_dir: Path, out: Path, overrides: list[str], rows: list[dict[str, Any]]) -> Trainer:
    return Trainer(
        tiny_config(model_dir, out, [*FAST, *overrides]),
        engine=RecordingEngine(model_dir),
        reward_fn=kind_reward,
        train_data=rows,
    )


def read_metrics(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def prompts_of_step(engine: RecordingEngine, call: int) -> list[str]:
    return [prompt for prompt, _ in engine.calls[call]]


# ---------------------------------------------------------------------------------------------- entropy control


def test_entropy_controller_matches_a_hand_computed_sequence() -> None:
    # c0 = 0.01, target 0.5, Δ = 0.02, c_max = 0.05; entropy at the target counts as "not below"
    ctrl = AdaptiveEntropyController(0.01, target_entropy=0.5, step=0.02, max_coef=0.05)
    entropies = [0.3, 0.4, 0.2, 0.1, 0.6, 0.7, 0.5, 0.3]
    applied, after = [], []
    for e in entropies:
        applied.append(ctrl.coef_for(e))
        ctrl.update(e)
        after.append(ctrl.value)
    # below: c rises by 0.02 up to the 0.05 ceiling; at/above: bonus off and c falls to the 0 floor
    assert applied == pytest.approx([0.01, 0.03, 0.05, 0.05, 0.0, 0.0, 0.0, 0.0])
    assert after == pytest.approx([0.03, 0.05, 0.05, 0.05, 0.03, 0.01, 0.0, 0.02])
    # the pure rules agree with the controller
    assert applied_entropy_coef(0.3, 0.19, target=0.2) == 0.3
    assert applied_entropy_coef(0.3, 0.2, target=0.2) == 0.0
    assert next_entropy_coef(0.001, 0.1, target=0.2, step=0.001, max_coef=0.5) == pytest.approx(0.002)
    assert next_entropy_coef(0.0005, 0.3, target=0.2, step=0.001, max_coef=0.5) == 0.0
    # checkpoint round trip
    resumed = AdaptiveEntropyController(0.0, target_entropy=0.5, step=0.02, max_coef=0.05)
    resumed.load_state_dict(ctrl.state_dict())
    assert resumed.value == ctrl.value
    with pytest.raises(ValueError, match="init_coef ≤ max_coef"):
        AdaptiveEntropyController(0.6, target_entropy=0.2, step=0.001, max_coef=0.5)
    with pytest.raises(ConfigError, match="^algorithm.entropy.coef: .*algorithm.entropy.adaptive.max_coef"):
        load_config(None, ["model.path=/m", "algorithm.adaptive_entropy=true", "algorithm.entropy_coef=0.6"])


ENTROPY_CASES = {
    # the tiny random model's entropy (about 4.6 nats, near ln 102 for its 102 tokens) is always below 100:
    # c rises by 0.002, capped at 0.004
    "below_target": (100.0, 0.001, [0.001, 0.003, 0.004], [0.001, 0.003, 0.004]),
    # and never below 0: the bonus is off and c falls by 0.002 to the floor
    "above_target": (0.0, 0.003, [0.003, 0.001, 0.0], [0.0, 0.0, 0.0]),
}


@pytest.mark.parametrize("case", list(ENTROPY_CASES))
def test_trainer_moves_the_entropy_coef_by_the_rule(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    target, start, expected_coef, expected_applied = ENTROPY_CASES[case]
    overrides = [
        "trainer.total_steps=3",
        "algorithm.adaptive_entropy=true",
        f"algorithm.entropy_coef={start}",
        f"algorithm.target_entropy={target}",
        "algorithm.entropy_coef_step=0.002",
        "algorithm.max_entropy_coef=0.004",
    ]
    trainer = make_trainer(tiny_model_dir, tmp_path, overrides, kind_rows(["mixed"] * 8))
    sent: list[float | None] = []
    update_policy = trainer.parts.actor.update_policy

    def spy(batch: Any, **kwargs: Any) -> dict[str, float]:
        sent.append(kwargs.get("entropy_coef"))
        return update_policy(batch, **kwargs)

    monkeypatch.setattr(trainer.parts.actor, "update_policy", spy)
    trainer.fit()
    lines = read_metrics(tmp_path)
    assert [line["actor/entropy_coef"] for line in lines] == pytest.approx(expected_coef)
    assert [line["actor/entropy_coef_applied"] for line in lines] == pytest.approx(expected_applied)
    assert sent == pytest.approx(expected_applied)  # the actor's loss gets the gated coefficient
    # the bonus term is computed only on the steps it is on
    assert ["actor/entropy_loss" in line for line in lines] == [a > 0 for a in expected_applied]

    # and every transition follows the rule applied to the entropy measured on that step's batch
    def rule(coef: float, entropy: float) -> float:
        return next_entropy_coef(coef, entropy, target=target, step=0.002, max_coef=0.004)

    for now, nxt in itertools.pairwise(lines):
        assert nxt["actor/entropy_coef"] == pytest.approx(rule(now["actor/entropy_coef"], now["actor/entropy"]))
    assert trainer.entropy.controller is not None
    assert trainer.entropy.controller.value == pytest.approx(rule(expected_coef[-1], lines[-1]["actor/entropy"]))


# ---------------------------------------------------------------------------------------------- prompt filtering


def test_prompt_filter_rules() -> None:
    sampled = {0: 4, 1: 4, 2: 4, 3: 2}
    solved = {0: 4, 1: 1, 3: 2}  # 0 and 3 always solved, 2 never, 1 sometimes
    assert prompts_to_retire(solved, sampled, drop_solved=True, drop_unsolved=False) == ({0, 3}, set())
    assert prompts_to_retire(solved, sampled, drop_solved=True, drop_unsolved=True) == ({0, 3}, {2})
    # a sample is solved when its reward reaches the threshold (here partial credit 0.5 is not enough)
    filt = PromptFilter(drop_solved=True, drop_unsolved=True, solved_threshold=1.0)
    filt.record([7, 7, 8, 8, 9, 9], [1.0, 1.5, 0.5, 0.0, 1.0, 0.5])
    outcome = filt.end_epoch(num_prompts=10, min_active=2)
    assert (outcome.solved, outcome.unsolved, outcome.skipped) == ({7}, {8}, False)
    assert filt.retired == {7, 8} and filt.sampled == {}  # the next epoch counts afresh


def test_filter_retires_exactly_the_all_solved_prompts(tiny_model_dir: Path, tmp_path: Path) -> None:
    kinds = ["solved", "mixed", "mixed", "solved", "mixed", "solved", "unsolved", "mixed"]
    rows = kind_rows(kinds)
    # 8 prompts, 4 per step: epoch 0 is steps 1-2; epoch 1 has the 5 prompts left: steps 3 (4) and 4 (1)
    trainer = make_trainer(tiny_model_dir, tmp_path, ["trainer.total_steps=4", "data.filter_solved=true"], rows)
    trainer.fit()
    engine = trainer.engine
    assert isinstance(engine, RecordingEngine)
    assert trainer.prompt_filter is not None
    assert trainer.prompt_filter.retired_solved == {0, 3, 5}
    assert trainer.prompt_filter.retired_unsolved == set()  # filter_unsolved is off: row 6 stays
    assert trainer.loader.excluded == {0, 3, 5}
    epoch0 = prompts_of_step(engine, 0) + prompts_of_step(engine, 1)  # one generate call per step
    epoch1 = prompts_of_step(engine, 2) + prompts_of_step(engine, 3)
    assert sorted(epoch0) == sorted(row["prompt"] for row in rows)
    assert sorted(epoch1) == sorted(rows[i]["prompt"] for i in (1, 2, 4, 6, 7))
    lines = read_metrics(tmp_path)
    assert [line["data/filtered_solved"] for line in lines] == [0, 0, 3, 3]
    assert [line["data/active_prompts"] for line in lines] == [8, 8, 5, 5]
    assert [line["train/epoch"] for line in lines] == [0, 0, 1, 1]


def test_filter_never_leaves_less_than_a_batch(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = kind_rows(["solved"] * 5 + ["mixed"] * 3)  # retiring 5 would leave 3 < train_batch_size 4
    trainer = make_trainer(tiny_model_dir, tmp_path, ["trainer.total_steps=3", "data.filter_solved=true"], rows)
    with caplog.at_level(logging.WARNING, logger="rlloom.core_rl.data.prompt_filter"):
        trainer.fit()
    assert "keeping them all this epoch" in caplog.text
    assert trainer.loader.excluded == frozenset()
    lines = read_metrics(tmp_path)
    assert [line["data/active_prompts"] for line in lines] == [8, 8, 8]
    assert lines[2]["data/filter_skipped"] == 1.0 and "data/filter_skipped" not in lines[1]


# ---------------------------------------------------------------------------------------------- resume


def test_resume_restores_the_controller_and_the_filter(tiny_model_dir: Path, tmp_path: Path) -> None:
    kinds = ["solved", "mixed", "mixed", "solved", "mixed", "solved", "unsolved", "mixed"]
    rows = kind_rows(kinds)
    options = [
        "data.filter_solved=true",
        "data.filter_unsolved=true",
        "algorithm.adaptive_entropy=true",
        "algorithm.entropy_coef=0.001",
        "algorithm.target_entropy=100.0",
        "algorithm.entropy_coef_step=0.002",
    ]
    first = make_trainer(tiny_model_dir, tmp_path, ["trainer.total_steps=2", *options], rows)
    first.fit()  # the end of epoch 0, checkpointed; nothing retired yet
    assert first.loader.excluded == frozenset()
    assert first.entropy.controller is not None and first.prompt_filter is not None
    coef_after_2 = first.entropy.controller.value
    assert coef_after_2 == pytest.approx(0.005)  # 0.001 + 2 x 0.002

    resumed = make_trainer(tiny_model_dir, tmp_path, ["trainer.total_steps=3", *options], rows)
    assert resumed.step == 2
    assert resumed.entropy.controller is not None and resumed.entropy.controller.value == coef_after_2
    assert resumed.prompt_filter is not None
    # the epoch's solve counts came back: 2 samples each; solved rows 2/2, the unsolved row 0/2, mixed rows 1/2
    assert resumed.prompt_filter.sampled == dict.fromkeys(range(8), 2)
    assert resumed.prompt_filter.solved == {i: {"solved": 2, "unsolved": 0, "mixed": 1}[k] for i, k in enumerate(kinds)}
    resumed.fit()
    # so the epoch boundary right after the resume retires from them: 3 solved and 1 unsolved prompt
    assert resumed.prompt_filter.retired_solved == {0, 3, 5}
    assert resumed.prompt_filter.retired_unsolved == {6}
    engine = resumed.engine
    assert isinstance(engine, RecordingEngine)
    assert sorted(prompts_of_step(engine, 0)) == sorted(rows[i]["prompt"] for i in (1, 2, 4, 7))
    step3 = read_metrics(tmp_path)[-1]
    assert step3["step"] == 3
    assert step3["actor/entropy_coef"] == pytest.approx(coef_after_2)
    assert (step3["data/filtered_solved"], step3["data/filtered_unsolved"], step3["data/active_prompts"]) == (3, 1, 4)
    # a checkpoint also resumes mid-epoch with the retired prompts still out
    resumed.save()
    again = make_trainer(tiny_model_dir, tmp_path, ["trainer.total_steps=4", *options], rows)
    assert again.loader.excluded == {0, 3, 5, 6}
    assert again.prompt_filter is not None and again.prompt_filter.retired == {0, 3, 5, 6}


# ---------------------------------------------------------------------------------------------- context stages


def test_max_tokens_schedule_is_validated() -> None:
    cfg = load_config(
        None, ["model.path=/m", "rollout.max_tokens=8", "rollout.max_tokens_schedule=[{step: 3, max_tokens: 16}]"]
    )
    assert [cfg.rollout.max_tokens_at(step) for step in range(5)] == [8, 8, 8, 16, 16]
    with pytest.raises(ConfigError, match="^rollout.max_tokens_schedule: stage steps must strictly increase"):
        load_config(
            None,
            ["model.path=/m", "rollout.max_tokens_schedule=[{step: 5, max_tokens: 16}, {step: 5, max_tokens: 24}]"],
        )
    with pytest.raises(ConfigError, match=r"^rollout.max_tokens_schedule\[0\].step: input should be greater"):
        load_config(None, ["model.path=/m", "rollout.max_tokens_schedule=[{step: 0, max_tokens: 16}]"])
    with pytest.raises(ConfigError, match=r"^rollout.max_tokens_schedule\[0\].max_tokens: input should be greater"):
        load_config(None, ["model.path=/m", "rollout.max_tokens_schedule=[{step: 2, max_tokens: 0}]"])
    assert load_config(None, ["model.path=/m"]).rollout.max_tokens_schedule == []


def test_max_tokens_schedule_reaches_the_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    schedule = "rollout.max_tokens_schedule=[{step: 2, max_tokens: 5}, {step: 3, max_tokens: 9}]"
    trainer = make_trainer(
        tiny_model_dir, tmp_path, ["trainer.total_steps=3", "rollout.max_tokens=2", schedule], kind_rows(["mixed"] * 8)
    )
    trainer.fit()
    engine = trainer.engine
    assert isinstance(engine, RecordingEngine)
    # one generate call per step (no validation, no ReMax)
    sent = [{max_tokens for _, max_tokens in call} for call in engine.calls]
    assert sent == [{2}, {5}, {9}]
    lines = read_metrics(tmp_path)
    assert [line["rollout/max_tokens"] for line in lines] == [2, 5, 9]
    for line, limit in zip(lines, [2, 5, 9], strict=True):
        assert line["response_length/max"] <= limit
