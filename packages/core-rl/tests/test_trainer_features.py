"""The loop with every optional piece switched on: GAE with a critic, KL in the reward (adaptive controller),
TIS, DAPO dynamic sampling and overlong filtering, padding-free micro-batches, ReMax baselines, validation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.config.schema import ConfigError, ModelConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import DataError, generation_request
from rlloom.core_rl.observe.metrics import PhaseTimer, best_worst_at_n
from rlloom.core_rl.phases.token_weights import policy_diagnostics, set_token_weights
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import PolicyActor, ReferencePolicy
from rlloom.core_rl.workers.critic import VALUE_HEAD_FILE, ValueModel


def _step_batch(trainer: Trainer) -> tuple[list[Trajectory], dict[str, float]]:
    """The trajectories and metrics of the step's rollout phase (generation, rewards, dynamic sampling)."""
    drawn = trainer._step_batch(PhaseTimer())
    return drawn.trajectories, drawn.metrics


def make_trainer(model_dir: Path, out: Path, overrides: list[str], engine: SamplingEngine | None = None) -> Trainer:
    """The tiny run's trainer on 8 training and 3 validation prompts."""
    return Trainer(
        tiny_config(model_dir, out, overrides),
        engine=engine or SamplingEngine(model_dir),
        reward_fn=digit_reward,
        train_data=sum_rows(8),
        val_data=sum_rows(3, seed=5),
    )


def fit(model_dir: Path, out: Path, overrides: list[str]) -> tuple[Trainer, list[dict[str, float]]]:
    engine = SamplingEngine(model_dir)
    trainer = make_trainer(model_dir, out, overrides, engine)
    trainer.fit()
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert engine.weight_updates == 1 + trainer.step  # once at start, once per step
    return trainer, lines


def test_max_prompt_length_stops_or_filters_before_training(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Rows over data.max_prompt_length stop the run at construction, naming the row, or are left out of training
    and validation with filter_overlong_prompts (so the steps per epoch count only the rows kept)."""
    long_row = {"prompt": [{"role": "user", "content": "9" * 40}], "reward_model": {"ground_truth": "0"}}
    engine = SamplingEngine(tiny_model_dir)  # renders prompts with its own code: the lengths the model will see
    short, long = (len(engine._prompt_ids(generation_request(r, SamplingParams()))) for r in (sum_rows(1)[0], long_row))
    assert short <= 30 < long
    config = tiny_config(tiny_model_dir, tmp_path, ["data.max_prompt_length=30", "trainer.total_steps=null"])
    rows, val = [*sum_rows(8), long_row], [long_row, *sum_rows(3, seed=5)]
    with pytest.raises(DataError, match=rf"train row 9 of 9: the prompt is {long} tokens, over data.max_prompt_len"):
        Trainer(config, engine=engine, reward_fn=digit_reward, train_data=rows)
    config.data.filter_overlong_prompts = True
    trainer = Trainer(config, engine=engine, reward_fn=digit_reward, train_data=rows, val_data=val)
    assert trainer.loader.rows == rows[:8] and trainer.val_data == val[1:]
    assert trainer.total_steps == 2  # one epoch of 8 rows at data.train_batch_size=4


def test_critic_warmup_steps_leave_the_policy_and_the_engine_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = [
        "algorithm.advantage.estimator=gae",
        "trainer.critic_warmup=2",
        "trainer.total_steps=3",
        "critic.lr=1e-3",
    ]
    engine = SamplingEngine(tiny_model_dir)
    make_trainer(tiny_model_dir, tmp_path, overrides, engine).fit()
    assert engine.weight_updates == 2  # at the start, and after step 3: warm-up steps leave the policy as it was
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert [line["actor/critic_warmup"] for line in steps] == [1.0, 1.0, 0.0]
    assert ["actor/pg_loss" in line for line in steps] == [False, False, True]
    assert all("critic/vf_loss" in line for line in steps)


def test_critic_warmup_freezes_the_actor_and_trains_the_critic(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = ["algorithm.advantage.estimator=gae", "trainer.critic_warmup=1", "critic.lr=1e-3"]
    trainer = make_trainer(tiny_model_dir, tmp_path, overrides)
    actor, critic = trainer.parts.actor.model, trainer.parts.critic.model
    before = [p.detach().clone() for p in (*actor.parameters(), *critic.parameters())]
    trainer.step = 1
    trainer.train_step()
    after = [p.detach() for p in (*actor.parameters(), *critic.parameters())]
    changed = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
    n_actor = len(list(actor.parameters()))
    assert not any(changed[:n_actor]) and any(changed[n_actor:])
    with pytest.raises(ValueError, match="trains no critic"):
        tiny_config(tiny_model_dir, tmp_path, ["trainer.critic_warmup=2"])  # GRPO has no critic to warm up


def test_ppo_with_critic_kl_in_reward_tis_and_filters(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ppo"
    trainer, lines = fit(
        tiny_model_dir,
        out,
        [
            "trainer.total_steps=2",
            "algorithm.advantage.estimator=gae",
            "algorithm.advantage.gamma=0.99",
            "algorithm.advantage.lam=0.95",
            "algorithm.kl.use_loss=false",
            "algorithm.kl.use_in_reward=true",
            "algorithm.kl.controller=adaptive",
            "algorithm.kl.reward_coef=0.05",
            "algorithm.tis_cap=2.0",
            "algorithm.overlong_filter=true",
            "algorithm.policy_loss.dual_clip=3.0",
            "actor.padding_free=true",
            "critic.padding_free=true",
            "critic.lr=1e-3",
            "trainer.val_every=2",
            "trainer.trackers=[jsonl,tensorboard]",
        ],
    )
    train_lines = [line for line in lines if "reward/mean" in line]
    assert [line["step"] for line in train_lines] == [1, 2]
    for key in (
        "critic/vf_loss",
        "kl_in_reward/coef",
        "mismatch/mismatch_kl_k3",
        "overlong/filtered_frac",
        "values/mean",
    ):
        assert key in train_lines[0], key
    # the adaptive controller moved the coefficient after step 1
    assert train_lines[1]["kl_in_reward/coef"] != train_lines[0]["kl_in_reward/coef"]
    # sampling and training log-probs come from the same fp32 weights here: the mismatch is float noise
    assert abs(train_lines[0]["mismatch/mismatch_kl_k1"]) < 1e-4
    assert any("val/reward/mean" in line for line in lines)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    # the critic is checkpointed too and reloads with its value head
    critic_dir = out / "checkpoints" / "step_2" / "critic"
    assert (critic_dir / VALUE_HEAD_FILE).exists()
    reloaded = ValueModel.from_pretrained(ModelConfig(path=str(critic_dir)), str(critic_dir))
    assert trainer.parts.critic is not None
    live = trainer.parts.critic.model.value_head.weight
    assert bool((reloaded.value_head.weight == live.cpu()).all()) and bool(live.abs().sum() > 0)


def test_dynamic_sampling_and_remax(tiny_model_dir: Path, tmp_path: Path) -> None:
    _, lines = fit(
        tiny_model_dir,
        tmp_path / "dapo",
        [
            "trainer.total_steps=2",
            "algorithm.advantage.estimator=remax",
            "algorithm.dynamic_sampling=true",
            "algorithm.max_sampling_rounds=2",
            "algorithm.kl.use_loss=false",
            "trainer.val_before_train=true",
        ],
    )
    assert lines[0]["step"] == 0 and "val/reward/mean" in lines[0]
    for line in lines[1:]:
        assert 1 <= line["dynamic_sampling/rounds"] <= 2
        # never more groups than asked for: 4 prompts x 4 samples
        assert line["batch/samples"] <= 16


def test_val_only_validates_once_and_trains_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    """trainer.val_only (veRL's key): one validation, logged and written at step 0, then stop: no rollout step, no
    optimizer step, no checkpoint, the weights as loaded."""
    out = tmp_path / "val_only"
    engine = SamplingEngine(tiny_model_dir)
    trainer = make_trainer(tiny_model_dir, out, ["trainer.val_only=true", "trainer.val_before_train=true"], engine)
    model = trainer.parts.actor.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def no_training() -> dict[str, float]:
        raise AssertionError("trainer.val_only ran a training step")

    trainer.train_step = no_training  # type: ignore[method-assign]
    returned = trainer.fit()
    assert trainer.step == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not trainer.parts.actor.optimizer.state  # AdamW never stepped
    assert engine.weight_updates == 1  # the sync at start only
    assert not (out / "checkpoints").exists()
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 1  # once, though val_before_train is on too
    assert lines[0] == {"step": 0, **returned}
    assert "val/reward/mean" in returned and "val/reward/toy_sum/mean" in returned
    assert returned["val/response_length/mean"] > 0


def test_val_only_validates_a_finished_runs_checkpoint_and_needs_validation_rows(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    one_step = ["trainer.total_steps=1", "actor.warmup_steps=0"]
    trained = make_trainer(tiny_model_dir, out, one_step)
    trained.fit()
    weights = {k: v.detach().clone() for k, v in trained.parts.actor.model.state_dict().items()}
    # the run is finished: training again is refused, validating it is not
    trainer = make_trainer(tiny_model_dir, out, [*one_step, "trainer.val_only=true"])
    assert trainer.step == 1
    assert all(torch.equal(weights[k], v) for k, v in trainer.parts.actor.model.state_dict().items())
    val = trainer.fit()
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 1] and lines[-1] == {"step": 1, **val}
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_1"]
    with pytest.raises(ConfigError, match="trainer.val_only: there are no validation rows to validate on; pass"):
        Trainer(
            tiny_config(tiny_model_dir, tmp_path / "no_val", ["trainer.val_only=true"]),
            engine=SamplingEngine(tiny_model_dir),
            reward_fn=digit_reward,
            train_data=sum_rows(8),
        )


def test_dynamic_sampling_without_any_signal_skips_the_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Every group scores the same, so DAPO keeps none: the step logs its rollouts and leaves the weights alone
    (an update on zero advantages would still move them through AdamW's momentum and weight decay)."""
    import torch

    from rlloom.core_rl.contracts.protocols import RewardOutput

    def flat_reward(trajectories: list[Trajectory]) -> list[RewardOutput]:
        return [RewardOutput(score=1.0) for _ in trajectories]

    out = tmp_path / "flat"
    overrides = ["trainer.total_steps=2", "algorithm.dynamic_sampling=true", "algorithm.max_sampling_rounds=2"]
    engine = SamplingEngine(tiny_model_dir)
    trainer = Trainer(
        tiny_config(tiny_model_dir, out, overrides),
        engine=engine,
        reward_fn=flat_reward,
        train_data=sum_rows(8),
    )
    before = {k: v.detach().clone() for k, v in trainer.parts.actor.model.state_dict().items()}
    trainer.fit()
    after = trainer.parts.actor.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert engine.weight_updates == 1  # the sync at start only: nothing changed to send
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["dynamic_sampling/skipped_update"] == 1.0 and line["dynamic_sampling/rounds"] == 2.0
        assert line["reward/mean"] == 1.0 and line["batch/samples"] > 0
        assert not any(key.startswith("actor/") for key in line)


def test_outcome_reward_sits_on_the_last_sampled_token() -> None:
    import torch

    from rlloom.core_rl.trainer import outcome_token_rewards

    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])  # row 1: an observation token, then a turn
    rewards = outcome_token_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert rewards.tolist() == [[0, 2.0, 0, 0], [0, 0, -1.0, 0], [0, 0, 0, 0]]


def test_soft_overlong_punishment_shapes_training_rewards_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = ["rollout.max_tokens=8", "algorithm.overlong_buffer=4", "algorithm.overlong_penalty_factor=0.5"]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides)
    trajectories, metrics = _step_batch(trainer)
    task = digit_reward(trajectories)
    lengths = [len(t.response_ids) for t in trajectories]
    assert max(lengths) > 4  # some responses reach into the buffer, so the check below means something
    for traj, plain, length in zip(trajectories, task, lengths, strict=True):
        # DAPO eq. 13 by hand: 0 up to 8 - 4 tokens, then -(length - 4) / 4 * 0.5
        expected = -max(0, length - 4) / 4 * 0.5
        assert traj.reward_components["overlong_penalty"] == expected
        assert traj.reward == plain.score + expected
    assert metrics["overlong/penalised_frac"] == sum(n > 4 for n in lengths) / len(lengths)
    # validation reports the task reward alone: greedy validation equals a run without the punishment
    plain_trainer = make_trainer(tiny_model_dir, tmp_path / "plain", ["rollout.max_tokens=8"])
    assert trainer.validate()["val/reward/mean"] == plain_trainer.validate()["val/reward/mean"]


def test_overlong_metrics_cover_every_dynamic_sampling_round(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With dynamic sampling the step samples several rounds; the overlong metrics describe all of them (they
    described only the last round's samples)."""
    overrides = ["rollout.max_tokens=8", "algorithm.overlong_buffer=4", "algorithm.dynamic_sampling=true"]
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path, [*overrides, "algorithm.max_sampling_rounds=3"]),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=lambda trajectories: [RewardOutput(score=1.0) for _ in trajectories],  # no group has signal
        train_data=sum_rows(8),
    )
    drawn: list[Trajectory] = []
    collect = trainer.rounds.collect

    def recording(rows: Any, sampling: Any, prefix: str) -> list[Trajectory]:
        drawn.extend(out := collect(rows, sampling, prefix))
        return out

    trainer.rounds.collect = recording
    _, metrics = _step_batch(trainer)
    assert metrics["dynamic_sampling/rounds"] == 3 and len(drawn) == 3 * 16
    penalties = [-max(0, len(t.response_ids) - 4) / 4 for t in drawn]  # DAPO eq. 13 by hand, factor 1
    assert len({len(t.response_ids) for t in drawn}) > 1  # lengths differ, so the rounds' means differ
    assert metrics["overlong/penalty_mean"] == pytest.approx(sum(penalties) / len(penalties))
    assert metrics["overlong/penalised_frac"] == pytest.approx(sum(p < 0 for p in penalties) / len(penalties))


def test_validation_sampling_settings_reach_the_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, float, float]] = []

    class Recording(SamplingEngine):
        def generate(self, requests):  # type: ignore[no-untyped-def]
            seen.extend((r.sampling.n, r.sampling.temperature, r.sampling.top_p) for r in requests)
            return super().generate(requests)

    overrides = ["rollout.top_p=1.0", "rollout.val_temperature=0.6", "rollout.val_n=2", "rollout.val_top_p=0.95"]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides, Recording(tiny_model_dir))
    trainer.validate()
    assert seen == [(2, 0.6, 0.95)] * 3
    assert trainer.sampling.top_p == 1.0  # training sampling is untouched


def test_rollout_stop_strings_and_min_p_reach_the_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    seen: list[tuple[list[str], float]] = []

    class Recording(SamplingEngine):
        def generate(self, requests):  # type: ignore[no-untyped-def]
            seen.extend((r.sampling.stop, r.sampling.min_p) for r in requests)
            return super().generate(requests)

    overrides = ["rollout.stop=['</answer>', 'Final:']", "rollout.min_p=0.05"]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides, Recording(tiny_model_dir))
    trainer.validate()
    trainer.step = 1
    trainer.train_step()
    assert seen == [(["</answer>", "Final:"], 0.05)] * (3 + 4)  # 3 validation prompts, then 4 training prompts


def test_single_update_steps_take_old_logprobs_from_the_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One epoch and one mini-batch per step: `algorithm.old_logprobs=auto` skips the separate forward, and the
    step ends with the weights and diagnostics that `recompute` (the forward, then the update) gives."""
    import torch

    overrides = ["trainer.total_steps=1", "actor.warmup_steps=0", "actor.ppo_epochs=1", "actor.mini_batch_size=4"]

    def one_step(mode: str) -> tuple[Trainer, dict[str, float], int]:
        """The trainer, its step's metrics, and how many old-log-prob forwards the actor ran."""
        trainer = make_trainer(tiny_model_dir, tmp_path / mode, [*overrides, f"algorithm.old_logprobs={mode}"])
        actor = trainer.parts.actor
        calls: list[int] = []
        forward = actor.compute_logprobs

        def counted(batch, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(batch.batch_size)
            return forward(batch, **kwargs)

        actor.compute_logprobs = counted  # type: ignore[method-assign]
        return trainer, trainer.fit(), len(calls)

    (auto, m_auto, auto_calls), (recompute, m_recompute, recompute_calls) = one_step("auto"), one_step("recompute")
    assert (auto_calls, recompute_calls) == (0, 1)
    assert m_auto["actor/old_logprobs_from_update"] == 1.0 and m_recompute["actor/old_logprobs_from_update"] == 0.0
    assert "timing/old_logprobs_s" not in m_auto and "timing/old_logprobs_s" in m_recompute
    assert m_auto["batch/samples"] == m_recompute["batch/samples"] == 16  # the same rollouts
    for key in ("actor/entropy", "actor/kl_mean", "mismatch/mismatch_kl_k3", "actor/pg_loss", "actor/grad_norm"):
        assert m_auto[key] == pytest.approx(m_recompute[key], rel=1e-4, abs=1e-7), key
    for a, b in zip(auto.parts.actor.model.parameters(), recompute.parts.actor.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_old_logprobs_are_recomputed_when_something_reads_them_before_the_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    on_policy = ["actor.ppo_epochs=1", "actor.mini_batch_size=4"]
    cases = {
        "two epochs": ["actor.mini_batch_size=4"],  # tiny config: 2 epochs
        "two mini-batches": ["actor.ppo_epochs=1", "actor.mini_batch_size=2"],
        "TIS": [*on_policy, "algorithm.tis_cap=2.0"],
        "KL in reward": [*on_policy, "algorithm.kl.use_in_reward=true"],
        "adaptive entropy": [*on_policy, "algorithm.adaptive_entropy=true"],
    }
    for name, overrides in cases.items():
        trainer = make_trainer(tiny_model_dir, tmp_path / name.replace(" ", "_"), overrides)
        batch = TrajectoryBatch.from_trajectories(_step_batch(trainer)[0], 0)
        assert not trainer._update_supplies_old_logprobs(batch), name
    trainer = make_trainer(tiny_model_dir, tmp_path / "on_policy", on_policy)
    batch = TrajectoryBatch.from_trajectories(_step_batch(trainer)[0], 0)
    assert trainer._update_supplies_old_logprobs(batch)


def test_high_entropy_selection_and_tis_mode_set_the_update_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    """top_entropy_quantile keeps the policy-gradient weight (here the sequence-truncated TIS weight) of the
    batch's high-entropy tokens and zeroes the others'; a step trains with both switched on."""
    overrides = ["algorithm.tis_cap=2.0", "algorithm.tis_mode=sequence_truncate", "algorithm.top_entropy_quantile=0.5"]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides)
    trajectories = [
        Trajectory(prompt_ids=[5], response_ids=[6, 7, 8], loss_mask=[1, 1, 1], rollout_logprobs=[0.0, 0.0, 0.0]),
        Trajectory(prompt_ids=[5], response_ids=[6, 7], loss_mask=[1, 1], rollout_logprobs=[0.0, 0.0]),
    ]
    batch = TrajectoryBatch.from_trajectories(trajectories, pad_token_id=0)
    # sequence ratios: exp(0.1 + 0.2 + 0.3) = 1.82 (under the cap), exp(1.0 + 0.0) = 2.72 -> 2
    batch["old_logprobs"] = torch.tensor([[0.1, 0.2, 0.3], [1.0, 0.0, 0.0]])
    entropy = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 7.0]])  # 7.0 is padding
    metrics = policy_diagnostics(batch, entropy, trainer.cfg.algorithm)
    metrics.update(set_token_weights(batch, entropy, trainer.cfg.algorithm))
    # valid entropies 0.1 0.2 0.5 0.8 0.9: the median 0.5 and above are kept
    ratio = math.exp(0.6)
    torch.testing.assert_close(batch["is_weights"], torch.tensor([[ratio, 0.0, ratio], [0.0, 2.0, 0.0]]))
    assert metrics["actor/high_entropy_token_frac"] == pytest.approx(3 / 5)
    assert metrics["mismatch/tis_capped_frac"] == pytest.approx(1 / 2)

    trainer.total_steps = 1
    trainer.fit()
    step = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0.5 <= step["actor/high_entropy_token_frac"] < 0.75  # ties at the median may keep a few more
    assert step["actor/old_logprobs_from_update"] == 0.0  # the selection needs the old-log-prob pass's entropy


def test_best_worst_and_std_at_n_hand_computed() -> None:
    rewards = [1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.0, 1.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]
    out = best_worst_at_n(rewards, groups, "val/reward/x")
    assert out["val/reward/x/best@3"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert out["val/reward/x/worst@3"] == pytest.approx((0.0 + 0.5 + 0.0) / 3)
    std_a = math.sqrt((2 * (1 / 3) ** 2 + (2 / 3) ** 2) / 3)  # population std of {1, 0, 0}
    assert out["val/reward/x/std@3"] == pytest.approx((std_a + 0.0 + std_a) / 3)
    assert best_worst_at_n([1.0, 0.0], ["a", "b"], "p") == {}  # one sample per prompt: nothing to compare
    with pytest.raises(ValueError, match="3 rewards for 2 group ids"):
        best_worst_at_n([1.0, 0.0, 1.0], ["a", "b"], "p")


def test_validation_with_several_samples_reports_best_and_worst_at_n(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = ["rollout.val_n=3", "rollout.val_temperature=1.0", f"trainer.validation_data_dir={tmp_path / 'val'}"]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides)
    metrics = trainer.validate()
    records = [json.loads(line) for line in (tmp_path / "val" / "0.jsonl").read_text().splitlines()]
    by_prompt: dict[str, list[float]] = {}
    for record in records:
        by_prompt.setdefault(record["group_id"], []).append(record["reward"])
    assert len(by_prompt) == 3 and all(len(r) == 3 for r in by_prompt.values())
    best = sum(max(r) for r in by_prompt.values()) / 3
    worst = sum(min(r) for r in by_prompt.values()) / 3
    assert metrics["val/reward/toy_sum/best@3"] == pytest.approx(best)
    assert metrics["val/reward/toy_sum/worst@3"] == pytest.approx(worst)
    assert metrics["val/reward/toy_sum/worst@3"] <= metrics["val/reward/mean"] <= metrics["val/reward/toy_sum/best@3"]


def test_batch_std_scope_reaches_the_advantages(tiny_model_dir: Path, tmp_path: Path) -> None:
    """algorithm.advantage.std_scope=batch: each response's advantage is (reward - its group's mean) / the std of all
    the step's rewards, read back from the step's rollout dump."""
    overrides = [
        "trainer.total_steps=2",
        "algorithm.advantage.std_scope=batch",
        f"trainer.rollout_data_dir={tmp_path / 'r'}",
    ]
    fit(tiny_model_dir, tmp_path / "run", overrides)
    records = [json.loads(line) for line in (tmp_path / "r" / "1.jsonl").read_text().splitlines()]
    rewards = torch.tensor([r["reward"] for r in records], dtype=torch.float64)
    groups: dict[str, list[float]] = {}
    for record in records:
        groups.setdefault(record["group_id"], []).append(record["reward"])
    for record in records:
        mean = sum(groups[record["group_id"]]) / len(groups[record["group_id"]])
        expected = (record["reward"] - mean) / (float(rewards.std()) + 1e-6)
        assert record["advantage"] == pytest.approx(expected, abs=1e-4)


def test_dynamic_sampling_filters_on_a_reward_component_band(tiny_model_dir: Path, tmp_path: Path) -> None:
    """EasyR1's online filtering: groups are kept when the mean of filter_key's component is inside the band;
    the step's dump shows which groups that should be."""
    overrides = [
        "trainer.total_steps=2",
        "algorithm.dynamic_sampling=true",
        "algorithm.max_sampling_rounds=1",
        "algorithm.filter_band=[0.01, 0.99]",
        "algorithm.filter_key=exact",
        f"trainer.rollout_data_dir={tmp_path / 'r'}",
    ]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides)
    trainer.step = 1
    metrics = trainer.train_step()
    records = [json.loads(line) for line in (tmp_path / "r" / "1.jsonl").read_text().splitlines()]
    exact: dict[str, list[float]] = {}
    for record in records:
        exact.setdefault(record["group_id"], []).append(record["reward_components"]["exact"])
    in_band = [g for g, values in exact.items() if 0.01 < sum(values) / len(values) < 0.99]
    if metrics.get("dynamic_sampling/skipped_update"):  # no group kept: the dump holds the whole round
        assert len(exact) == 4 and not in_band
        assert metrics["dynamic_sampling/kept_group_frac"] == 0.0
    else:  # the dump holds the kept groups only, each inside the band
        assert sorted(in_band) == sorted(exact)
        assert metrics["dynamic_sampling/kept_group_frac"] == pytest.approx(len(in_band) / 4)


def test_an_unknown_filter_key_names_the_components(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = ["algorithm.dynamic_sampling=true", "algorithm.filter_key=accuracy"]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides)
    trainer.step = 1
    with pytest.raises(
        ConfigError, match=r"algorithm.dynamic_sampling.filter_key: 'accuracy' is not among .* \(digits, exact\)"
    ):
        trainer.train_step()


def test_the_reference_moves_toward_the_policy_every_n_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    """TR-DPO's soft update (TRL's sync_ref_model): at steps divisible by N, ref = a * policy + (1 - a) * ref;
    the moved reference is checkpointed, so a resumed run continues from it rather than from model.path."""
    out = tmp_path / "run"
    sync = ["algorithm.ref_model_sync_steps=2", "algorithm.ref_model_mixup_alpha=0.25"]
    trainer = make_trainer(tiny_model_dir, out, ["trainer.total_steps=2", *sync])
    reference, policy = trainer.parts.reference, trainer.parts.actor
    assert isinstance(reference, ReferencePolicy) and isinstance(policy, PolicyActor)
    start = {name: p.detach().clone() for name, p in reference.model.named_parameters()}
    trainer.step = 1
    assert "actor/ref_model_synced" not in trainer.train_step()
    for name, p in reference.model.named_parameters():
        assert torch.equal(p, start[name]), name  # step 1 of every 2: untouched
    trainer.step = 2
    assert trainer.train_step()["actor/ref_model_synced"] == 1.0
    moved = dict(policy.model.named_parameters())
    for name, p in reference.model.named_parameters():
        torch.testing.assert_close(p, 0.25 * moved[name].detach() + 0.75 * start[name])
    embed = "model.embed_tokens.weight"  # tied to lm_head
    assert not torch.equal(dict(reference.model.named_parameters())[embed], start[embed])
    trainer.save()
    saved = {name: p.detach().clone() for name, p in reference.model.named_parameters()}

    resumed = make_trainer(tiny_model_dir, out, ["trainer.total_steps=3", *sync])
    assert resumed.step == 2
    assert isinstance(resumed.parts.reference, ReferencePolicy)
    for name, p in resumed.parts.reference.model.named_parameters():
        assert torch.equal(p, saved[name]), name


def test_reference_sync_is_refused_where_there_is_nothing_to_move() -> None:
    from rlloom.core_rl.config.loading import load_config

    base = ["model.path=/m", "algorithm.ref_model_sync_steps=10"]
    with pytest.raises(ConfigError, match="algorithm.ref_sync: every 10 steps, but there is no reference model"):
        load_config(None, [*base, "algorithm.kl.use_loss=false"])
    with pytest.raises(ConfigError, match="with LoRA the reference is the adapter-free base"):
        load_config(None, [*base, "algorithm.kl.use_loss=true", "model.lora_rank=8"])
    load_config(None, [*base, "algorithm.kl.use_loss=true"])


def test_a_loss_with_its_own_settings_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    """policy_loss_kwargs reach the loss in the update: kl_cov with ratio 1.0 penalises every token, so its
    pg_clipfrac (the penalised share) is 1."""
    overrides = [
        "algorithm.policy_loss.name=kl_cov",
        "algorithm.policy_loss.kwargs={kl_cov_ratio: 1.0, ppo_kl_coef: 0.5}",
        "trainer.total_steps=2",
    ]
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", overrides)
    trainer.step = 1
    metrics = trainer.train_step()
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1.0)
    assert math.isfinite(metrics["actor/pg_loss"])


def test_the_weight_ema_follows_the_policy_and_is_saved_beside_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """trainer.ema_beta: after steps with weights θ1, θ2 from θ0, ema = b(b θ0 + (1-b) θ1) + (1-b) θ2; each
    checkpoint holds it as a loadable `ema/` folder, and a resume continues the same average."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    trainer = make_trainer(tiny_model_dir, out, ["trainer.total_steps=2", "trainer.ema_beta=0.5"])
    policy = trainer.parts.actor
    assert isinstance(policy, PolicyActor)
    snapshots = [{n: p.detach().clone() for n, p in policy.model.named_parameters()}]
    for step in (1, 2):
        trainer.step = step
        trainer.train_step()
        snapshots.append({n: p.detach().clone() for n, p in policy.model.named_parameters()})
    assert trainer.ema is not None
    for name, value in trainer.ema.shadow.items():
        expected = 0.5 * (0.5 * snapshots[0][name] + 0.5 * snapshots[1][name]) + 0.5 * snapshots[2][name]
        torch.testing.assert_close(value, expected)
    path = trainer.save()
    saved = AutoModelForCausalLM.from_pretrained(path / "ema")
    for name, p in saved.named_parameters():
        torch.testing.assert_close(p, trainer.ema.shadow[name])
    for name, p in policy.model.named_parameters():  # saving the average left the policy's own weights in place
        assert torch.equal(p, snapshots[2][name]), name

    resumed = make_trainer(tiny_model_dir, out, ["trainer.total_steps=3", "trainer.ema_beta=0.5"])
    assert resumed.ema is not None and resumed.step == 2
    for name, value in resumed.ema.shadow.items():
        assert torch.equal(value, trainer.ema.shadow[name]), name
