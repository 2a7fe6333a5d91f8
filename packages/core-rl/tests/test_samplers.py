"""Prompt samplers (`data.sampler`): the default draws exactly the prompts rlloom always drew; a sampler named by a
file path is used by the trainer and its `update` gets every step's rows and rewards; the learnability curriculum's
probabilities match hand-computed values; a resume continues the same sequence; a bad config is refused at load."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_run import SamplingEngine, tiny_config

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import PromptLoader
from rlloom.core_rl.data.samplers import EpochSampler, LearnabilitySampler, SamplerFeedback, make_sampler
from rlloom.core_rl.trainer import Trainer

ROWS = [{"prompt": f"q{i}"} for i in range(10)]
FAST = ["rollout.n=2", "rollout.max_tokens=4", "actor.ppo_epochs=1", "algorithm.kl.use_loss=false"]


def old_loader_ids(
    num_rows: int, batch: int, *, seed: int, shuffle: bool, drop_last: bool, steps: int
) -> list[list[int]]:
    """The loader's logic before samplers existed, written out again: a permutation per epoch seeded by
    seed * 100_003 + epoch, sliced batch by batch; a new epoch once fewer rows remain than a (drop_last) batch."""
    out: list[list[int]] = []
    epoch, position = 0, 0
    for _ in range(steps):
        remaining = num_rows - position
        if remaining <= 0 or (drop_last and remaining < batch):
            epoch, position = epoch + 1, 0
        order = list(range(num_rows))
        if shuffle:
            order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
        out.append(order[position : position + batch])
        position += len(out[-1])
    return out


@pytest.mark.parametrize(("shuffle", "drop_last"), [(True, False), (True, True), (False, False), (False, True)])
def test_the_default_sampler_draws_the_old_order(shuffle: bool, drop_last: bool) -> None:
    for seed in (0, 1, 7):
        loader = PromptLoader(ROWS, 4, seed=seed, shuffle=shuffle, drop_last=drop_last)
        assert isinstance(loader.sampler, EpochSampler)
        got = [loader.next_batch_ids() for _ in range(9)]
        assert got == old_loader_ids(len(ROWS), 4, seed=seed, shuffle=shuffle, drop_last=drop_last, steps=9)
    # recorded from the loader as it was before samplers (5 rows, batches of 2, seed 3)
    five = [{"prompt": "q"}] * 5
    loader = PromptLoader(five, 2, seed=3)
    assert [loader.next_batch_ids() for _ in range(6)] == [[3, 0], [2, 1], [4], [3, 1], [2, 0], [4]]
    loader = PromptLoader(five, 2, seed=3, drop_last=True)
    assert [loader.next_batch_ids() for _ in range(4)] == [[3, 0], [2, 1], [3, 1], [2, 0]]
    # the trainer builds the same default from the config
    assert isinstance(make_sampler(None, {}, ROWS, seed=3, shuffle=True), EpochSampler)


def test_learnability_probabilities_match_hand_computed_values() -> None:
    sampler = LearnabilitySampler([{}] * 4, seed=0, prior=0.5, ema=0.5, floor=0.01, solved_threshold=1.0)
    assert sampler.probabilities([0, 1, 2, 3]).tolist() == pytest.approx([0.25] * 4)  # all unseen: p = 0.5
    # row 0 solved 4/4, row 1 1/4 (0.9 is under the threshold), row 2 0/4, row 3 not drawn
    sampler.update(
        SamplerFeedback(
            step=1,
            row_ids=(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2),
            rewards=(1.0, 1.0, 1.2, 1.0, 1.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0),
        )
    )
    assert sampler.pass_rate.tolist() == [1.0, 0.25, 0.0, 0.5]
    # w = p(1-p) + 0.01: 0.01, 0.1975, 0.01, 0.26; sum 0.4775
    assert sampler.probabilities([0, 1, 2, 3]).tolist() == pytest.approx(
        [0.01 / 0.4775, 0.1975 / 0.4775, 0.01 / 0.4775, 0.26 / 0.4775]
    )
    # the second observation of row 1 (2/2 solved) mixes in: 0.5 * 0.25 + 0.5 * 1 = 0.625, w = 0.244375
    sampler.update(SamplerFeedback(step=2, row_ids=(1, 1), rewards=(1.0, 1.0)))
    assert float(sampler.pass_rate[1]) == pytest.approx(0.625)
    assert sampler.probabilities([1, 3]).tolist() == pytest.approx([0.244375 / 0.504375, 0.26 / 0.504375])
    assert sampler.metrics() == pytest.approx(
        {
            "data/curriculum/seen_frac": 0.75,
            "data/curriculum/mean_pass_rate": (1.0 + 0.625 + 0.0) / 3,
            "data/curriculum/learnable_frac": 1 / 3,
        }
    )
    # draws follow the probabilities: rows 1 and 3 one at a time, 4000 times
    drawn = [sampler.next_ids([1, 3], epoch=0, position=k, count=1)[0] for k in range(4000)]
    assert drawn.count(1) / 4000 == pytest.approx(0.244375 / 0.504375, abs=0.03)
    # without replacement within a batch
    assert sorted(sampler.next_ids([0, 1, 2, 3], epoch=0, position=0, count=4)) == [0, 1, 2, 3]


def test_a_resumed_curriculum_continues_the_same_sequence() -> None:
    def feed(loader: PromptLoader, ids: list[int]) -> None:
        assert isinstance(loader.sampler, LearnabilitySampler)
        loader.sampler.update(
            SamplerFeedback(step=0, row_ids=tuple(ids), rewards=tuple(float(i % 3 == 0) for i in ids))
        )

    def fresh() -> PromptLoader:
        return PromptLoader(ROWS, 3, sampler=LearnabilitySampler(ROWS, seed=5))

    whole = fresh()
    for _ in range(5):
        feed(whole, whole.next_batch_ids())
    state = json.loads(json.dumps(whole.state_dict()))  # a checkpoint is written and read back
    after = []
    for _ in range(6):
        after.append(whole.next_batch_ids())
        feed(whole, after[-1])
    resumed = fresh()
    resumed.load_state_dict(state)
    again = []
    for _ in range(6):
        again.append(resumed.next_batch_ids())
        feed(resumed, again[-1])
    assert again == after
    # the old checkpoint format (no sampler keys) still loads; another sampler class starts fresh with a warning
    old = {k: v for k, v in state.items() if not k.startswith("sampler")}
    PromptLoader(ROWS, 3, sampler=LearnabilitySampler(ROWS, seed=5)).load_state_dict(old)
    default = PromptLoader(ROWS, 3)
    default.load_state_dict(state)
    assert (default.epoch, default.position) == (state["epoch"], state["position"])


SAMPLER_FILE = '''
"""A test sampler: rows in a rotating order, remembering every draw and every update."""


class RotatingSampler:
    def __init__(self, rows, *, seed, stride=1):
        self.num_rows, self.stride, self.offset = len(rows), stride, seed
        self.draws, self.updates, self.events = [], [], []

    def next_ids(self, active, *, epoch, position, count):
        ids = [active[(self.offset + k * self.stride) % len(active)] for k in range(count)]
        self.offset += count
        self.draws.append(ids)
        self.events.append("draw")
        return ids

    def update(self, feedback):
        self.updates.append(feedback)
        self.events.append(f"update {feedback.step}")

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        self.offset = state["offset"]
'''


def index_rows(count: int) -> list[dict[str, Any]]:
    return [
        {"prompt": f"{i}+{i}=", "reward_model": {"ground_truth": str(2 * i)}, "extra_info": {"i": i}}
        for i in range(count)
    ]


def index_reward(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    """Each sample scores its row's index / 10, whatever it says."""
    return [RewardOutput(score=traj.extra_info["i"] / 10) for traj in trajectories]


@pytest.mark.parametrize("off_policy", [False, True])
def test_a_sampler_from_a_file_is_used_and_fed_every_step(
    tiny_model_dir: Path, tmp_path: Path, off_policy: bool
) -> None:
    path = tmp_path / "my_sampler.py"
    path.write_text(textwrap.dedent(SAMPLER_FILE))
    overrides = [*FAST, "trainer.total_steps=3", "trainer.save_every=0", "data.train_batch_size=2"]
    overrides += [f"data.sampler.class_path={path}:RotatingSampler", "data.sampler.kwargs.stride=3"]
    if off_policy:
        overrides += ["trainer.one_step_off_policy=true", "actor.warmup_steps=0"]
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path / "run", overrides),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=index_reward,
        train_data=index_rows(5),
    )
    sampler: Any = trainer.loader.sampler
    assert type(sampler).__name__ == "RotatingSampler" and sampler.stride == 3
    metrics = trainer.fit()
    # seed 1 (tiny_grpo.yaml), stride 3 over 5 rows; the epoch's third batch is the one row left
    assert sampler.draws == [[1, 4], [3, 1], [0]]
    # each step's rewards reach the sampler before the next batch is drawn, off-policy too (the batch of step s + 1
    # is drawn during step s, right after step s's batch was fed back)
    assert sampler.events == ["draw", "update 1", "draw", "update 2", "draw", "update 3"]
    for drawn, update in zip(sampler.draws, sampler.updates, strict=True):
        assert list(update.row_ids) == [row for row in drawn for _ in range(2)]  # rollout.n = 2 samples per row
        assert list(update.rewards) == pytest.approx([i / 10 for i in update.row_ids])
    assert metrics["reward/mean"] == pytest.approx(0.0)  # the last step's only row, 0, scores 0


def test_learnability_sampler_trains_and_resumes_on_the_same_prompts(tiny_model_dir: Path, tmp_path: Path) -> None:
    def prompts(dump: Path, step: int) -> list[str]:
        return sorted({json.loads(line)["prompt"] for line in (dump / f"{step}.jsonl").read_text().splitlines()})

    common = [*FAST, "trainer.total_steps=4", "trainer.save_every=2", "data.train_batch_size=2"]
    common += ["data.sampler.class_path=learnability", "data.sampler.kwargs.solved_threshold=0.3"]
    runs = {}
    for name, extra in (("whole", []), ("resumed", [f"trainer.resume={tmp_path}/whole/checkpoints/step_2"])):
        out = tmp_path / name
        trainer = Trainer(
            tiny_config(tiny_model_dir, out, [*common, *extra, f"trainer.rollout_data_dir={out}/dump"]),
            engine=SamplingEngine(tiny_model_dir),
            reward_fn=index_reward,
            train_data=index_rows(6),
        )
        metrics = trainer.fit()
        runs[name] = trainer
        assert "data/curriculum/seen_frac" in metrics
    for step in (3, 4):
        assert prompts(tmp_path / "resumed" / "dump", step) == prompts(tmp_path / "whole" / "dump", step)
    whole, resumed = runs["whole"].loader.sampler, runs["resumed"].loader.sampler
    assert isinstance(whole, LearnabilitySampler) and isinstance(resumed, LearnabilitySampler)
    assert resumed.pass_rate.tolist() == whole.pass_rate.tolist()
    # rows 3..5 score >= 0.3 (solved every time), rows 0..2 never: every seen row is at 0 or 1
    seen = whole.seen > 0
    assert set(whole.pass_rate[seen].tolist()) <= {0.0, 1.0}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "samplers_here.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_bad_sampler_configs_are_refused_at_load(tmp_path: Path) -> None:
    def refused(overrides: list[str], match: str) -> None:
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["model.path=m", *overrides])

    refused(["data.sampler.class_path=my_module"], r"data.sampler.class_path: 'my_module' names no class")
    refused(["data.sampler.kwargs.x=1"], r"data.sampler.kwargs: set but data.sampler.class_path is not")
    refused(["data.sampler.class_name=Foo"], r"data.sampler.class_name'; that is veRL's name; here it is data.sampler")
    refused(
        [f"data.sampler.class_path={tmp_path}/missing.py:S"], r"data.sampler.class_path: file .*missing.py.* not exist"
    )
    refused(["data.sampler.class_path=no_such_pkg_xyz.mod:S"], r"cannot import module 'no_such_pkg_xyz.mod'")
    path = write(
        tmp_path,
        """
        class NoState:
            def __init__(self, rows, *, seed):
                pass

            def next_ids(self, active, *, epoch, position, count):
                return active[:count]

        def not_a_class():
            pass

        class Fine:
            def __init__(self, rows, *, seed, temperature=1.0):
                pass

            def next_ids(self, active, *, epoch, position, count):
                return list(active)[:count]

            def state_dict(self):
                return {}

            def load_state_dict(self, state):
                pass
        """,
    )
    refused([f"data.sampler.class_path={path}:Nope"], r"has no 'Nope'; the public names there: Fine, NoState")
    refused([f"data.sampler.class_path={path}:not_a_class"], r"is a function, not a class")
    refused([f"data.sampler.class_path={path}:NoState"], r"NoState lacks state_dict, load_state_dict")
    refused(
        [f"data.sampler.class_path={path}:Fine", "data.sampler.kwargs.temprature=2"],
        r"data.sampler.kwargs: Fine is built as Fine\(rows, seed=trainer.seed, \*\*data.sampler.kwargs\)",
    )
    ok = load_config(
        None, ["model.path=m", f"data.sampler.class_path={path}:Fine", "data.sampler.kwargs.temperature=2"]
    )
    assert ok.data.sampler.kwargs == {"temperature": 2}
    refused(
        ["data.sampler.class_path=learnability", "data.sampler.kwargs.decay=0.9"], r"LearnabilitySampler is built as"
    )
    # values are checked when the trainer builds the sampler
    with pytest.raises(ConfigError, match=r"data.sampler.kwargs: LearnabilitySampler refused them: floor=0"):
        make_sampler("learnability", {"floor": 0}, ROWS, seed=0, shuffle=True)


def test_a_sampler_that_answers_wrongly_is_named() -> None:
    class Wrong(EpochSampler):
        def next_ids(self, active: Sequence[int], *, epoch: int, position: int, count: int) -> list[int]:
            return [99] * count

    with pytest.raises(RuntimeError, match=r"Wrong.next_ids was asked for 4 of the 10 active rows .* \[99\]"):
        PromptLoader(ROWS, 4, sampler=Wrong()).next_batch_ids()
