"""What the trainer refuses or reports before and while it trains: rows in the wrong shape (before any model
loads), a `trainer.resume` that would corrupt or cannot find a run, a resumed run's config changes, and scoring
errors (on the console, and a stop when the first step's rewards all failed)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl import trainer as trainer_module
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import DataError, check_rows, read_jsonl
from rlloom.core_rl.run.folder import config_changes, record_config
from rlloom.core_rl.trainer import Trainer


class ModelLoadedError(Exception):
    """Raised in place of `build_run`: reaching it means every check before the model load passed."""


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ModelLoadedError

    monkeypatch.setattr(trainer_module, "build_run", refuse)


def construct(out: Path, overrides: Sequence[str], rows: Sequence[Any], **kwargs: Any) -> Trainer:
    engine = kwargs.pop("engine", None) or SamplingEngine.__new__(SamplingEngine)  # never used before build_run
    return Trainer(
        tiny_config("/unused", out, overrides), engine=engine, reward_fn=digit_reward, train_data=rows, **kwargs
    )


def test_rows_without_a_prompt_are_refused_before_the_model_loads(tmp_path: Path, no_model_load: None) -> None:
    gsm8k = [{"question": "1+1?", "answer": "#### 2"}] * 3
    rows = [*sum_rows(2), *gsm8k]
    with pytest.raises(DataError) as caught:
        construct(tmp_path, [], rows)
    assert str(caught.value).startswith(
        "train row 3 of 5: the row has no 'prompt' (its fields: answer, question) (2 more train rows have problems)"
    )
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in sum_rows(2)) + "\n\n" + json.dumps(gsm8k[0]) + "\n")
    with pytest.raises(DataError, match=rf"^{jsonl}:4: the row has no 'prompt'"):
        construct(tmp_path, [], read_jsonl(jsonl))
    with pytest.raises(DataError, match=r"^validation row 1 of 1: `prompt` holds 'hi', not a chat message"):
        construct(tmp_path, [], sum_rows(4), val_data=[{"prompt": ["hi"]}])
    with pytest.raises(ModelLoadedError):  # the same rows in the right shape get as far as the model load
        construct(tmp_path, [], sum_rows(4), val_data=sum_rows(1))


def test_agent_rows_need_a_question_or_a_prompt(tmp_path: Path, no_model_load: None) -> None:
    agent_rows = [{"question": "who?", "golden_answers": ["me"]}, {"prompt": [{"role": "user", "content": "x"}]}]
    with pytest.raises(ModelLoadedError):  # an agent's collector renders rows with only a question
        construct(tmp_path, [], agent_rows, collect_factory=lambda engine: lambda rows, sampling, prefix: [])
    with pytest.raises(DataError, match=r"^train row 1 of 1: the row has no 'prompt' nor 'question'"):
        construct(tmp_path, [], [{"golden_answers": ["me"]}], collect_factory=lambda engine: lambda *a: [])
    check_rows([{"prompt": "plain text"}, {"prompt_ids": [1, 2]}], split="train")  # both single-turn shapes
    with pytest.raises(DataError, match=r"^train row 1 of 1: `prompt_ids` is not a non-empty list"):
        check_rows([{"prompt_ids": []}], split="train")


def a_previous_run(out: Path) -> None:
    (out / "checkpoints" / "step_4").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step_4")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')


def test_resume_never_refuses_a_folder_holding_a_run(tmp_path: Path, no_model_load: None) -> None:
    out = tmp_path / "run"
    a_previous_run(out)
    with pytest.raises(ConfigError) as caught:
        construct(out, ["trainer.resume=never"], sum_rows(4))
    message = str(caught.value)
    assert message.startswith(f"trainer.output_dir={out} already holds a run (latest, step_4, metrics.jsonl)")
    assert "trainer.resume=never" in message and "trainer.resume=auto" in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_4"]  # untouched
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'
    with pytest.raises(ModelLoadedError):  # a fresh folder is fine
        construct(tmp_path / "fresh", ["trainer.resume=never"], sum_rows(4))


def test_resume_path_must_be_a_checkpoint(tmp_path: Path, no_model_load: None) -> None:
    missing = tmp_path / "nope" / "step_3"
    with pytest.raises(ConfigError, match=rf"^trainer.resume: {missing} is not a directory; give a checkpoint"):
        construct(tmp_path / "run", [f"trainer.resume={missing}"], sum_rows(4))
    (tmp_path / "half").mkdir()
    with pytest.raises(ConfigError, match=r"^trainer.resume: .*half is not a complete checkpoint"):
        construct(tmp_path / "run", [f"trainer.resume={tmp_path / 'half'}"], sum_rows(4))


def test_warmup_is_checked_against_steps_counted_from_epochs(tmp_path: Path, no_model_load: None) -> None:
    # 4 rows at train_batch_size 4: one step per epoch, and the tiny config warms up for 1 step
    with pytest.raises(ConfigError, match=r"^actor.warmup_steps: 1 warm-up steps but the run has 1 training steps"):
        construct(tmp_path, ["trainer.total_steps=null"], sum_rows(4))
    with pytest.raises(ModelLoadedError):
        construct(tmp_path, ["trainer.total_steps=null", "trainer.total_epochs=2"], sum_rows(4))


def test_resuming_announces_itself_and_warns_about_training_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    old = tiny_config("/m", out, ["trainer.total_steps=4"])
    checkpoint = out / "checkpoints" / "step_2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.yaml").write_text(old.to_yaml())
    (out / "config.yaml").write_text(old.to_yaml())
    new = tiny_config("/m", out, ["trainer.total_steps=8", "actor.lr=1e-4", "rollout.n=8", "trainer.val_every=2"])
    with caplog.at_level(logging.WARNING):
        record_config(new, out, resume_from=checkpoint, step=2)
    assert capsys.readouterr().err == f"resuming from {checkpoint} (step 2)\n"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "changes training: rollout.n: 4 → 8, actor.lr: 0.0003 → 0.0001 (the checkpoint's config" in warning
    assert "total_steps" not in warning and "val_every" not in warning
    assert yaml.safe_load((out / "config.step_2.yaml").read_text())["actor"]["lr"] == 0.0003  # kept, not lost
    assert yaml.safe_load((out / "config.yaml").read_text())["actor"]["lr"] == 0.0001
    assert config_changes({"a": {"b": 1, "gone": 2}}, {"a": {"b": 1, "new": 3}}) == []
    # where generations are written and how many are shown log the run; they do not change what it trains
    logging_only = ["trainer.rollout_data_dir=d", "trainer.validation_data_dir=v", "trainer.log_val_generations=4"]
    assert config_changes(old.model_dump(), tiny_config("/m", out, logging_only).model_dump()) == []


def reward_with_errors(bad_sources: set[str]) -> Any:
    def reward(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
        good = digit_reward(trajectories)
        return [
            RewardOutput(score=0.0, error=f"no scorer for data_source {t.data_source!r}")
            if t.data_source in bad_sources
            else out
            for t, out in zip(trajectories, good, strict=True)
        ]

    return reward


def rows_with_sources(sources: Sequence[str]) -> list[dict[str, Any]]:
    return [{**row, "data_source": source} for row, source in zip(sum_rows(len(sources)), sources, strict=True)]


def test_reward_errors_reach_the_console_once_per_message(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path, ["trainer.total_steps=2", "data.shuffle=false"]),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=reward_with_errors({"mystery"}),
        train_data=rows_with_sources(["toy_sum", "mystery", "toy_sum", "toy_sum"] * 2),
    )
    with caplog.at_level(logging.WARNING):
        metrics = trainer.fit()
    warnings = [r.getMessage() for r in caplog.records if "rewards failed" in r.getMessage()]
    assert warnings == [
        "train step 1: 4 of 16 rewards failed (scored 0): no scorer for data_source 'mystery' [each distinct error "
        "is shown once; rollout/reward_error/mean counts them every step]"
    ]
    assert metrics["rollout/reward_error/mean"] == 0.25  # the second step had them too: counted, not repeated


def test_a_first_step_whose_rewards_all_failed_stops_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path, ["trainer.total_steps=2"]),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=reward_with_errors({"gsm8k"}),
        train_data=rows_with_sources(["gsm8k"] * 4),
    )
    with pytest.raises(DataError) as caught:
        trainer.fit()
    assert str(caught.value).startswith(
        "every reward of the first training step failed (16 of 16): no scorer for data_source 'gsm8k' (x16). Check"
    )
    assert not (tmp_path / "checkpoints").exists()  # stopped before any update was saved


def test_a_config_changed_after_it_was_built_is_checked_again(tmp_path: Path, no_model_load: None) -> None:
    config = tiny_config("/unused", tmp_path, [])
    config.rollout.n = 1  # each field is checked on assignment, the combination (GRPO needs groups) is not
    engine = SamplingEngine.__new__(SamplingEngine)
    with pytest.raises(ConfigError, match=r"rollout.n: 1 sample per prompt, but algorithm.advantage.estimator=grpo"):
        Trainer(config, engine=engine, reward_fn=digit_reward, train_data=sum_rows(4))


def test_an_engine_tokenizing_differently_from_the_trainer_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rlloom.core_rl.tiny import char_tokenizer

    engine = SamplingEngine(tiny_model_dir)
    engine.tokenizer = char_tokenizer(alphabet="0123456789+= ")  # letters and newlines become <unk>
    config = tiny_config(tiny_model_dir, tmp_path, [])
    with pytest.raises(ConfigError, match=r"the engine's tokenizer .* encodes text differently from the trainer's"):
        Trainer(config, engine=engine, reward_fn=digit_reward, train_data=sum_rows(4))
    engine.tokenizer = char_tokenizer()  # the same tokenizer rebuilt: accepted
    Trainer(config, engine=engine, reward_fn=digit_reward, train_data=sum_rows(4))


def test_a_model_folder_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    from rlloom.core_rl.tiny import save_tiny_model
    from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

    saved = save_tiny_model(tmp_path)
    with pytest.raises(ValueError, match=rf"no tokenizer in {saved.model}; give the folder the tokenizer was saved in"):
        load_pretrained_tokenizer(saved.model)
    assert load_pretrained_tokenizer(saved.tokenizer)("ab")["input_ids"]


def test_a_non_finite_score_is_a_reward_error_not_a_nan_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A reward function's nan (say 0/0 in a custom rule) scores 0 and is reported; left in, it made its group's
    GRPO advantages nan and the optimizer skip every update of the step (grad_norm_nonfinite)."""

    def nan_for_mystery(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
        good = digit_reward(trajectories)
        pairs = zip(trajectories, good, strict=True)
        return [RewardOutput(score=float("nan")) if t.data_source == "mystery" else g for t, g in pairs]

    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path, ["trainer.total_steps=1", "actor.warmup_steps=0", "data.shuffle=false"]),
        engine=SamplingEngine(tiny_model_dir),
        reward_fn=nan_for_mystery,
        train_data=rows_with_sources(["toy_sum", "mystery", "toy_sum", "toy_sum"]),
    )
    metrics = trainer.fit()
    assert metrics["rollout/reward_error/mean"] == 0.25  # the 4 samples of the mystery row, of 16
    assert metrics["reward/min"] == 0.0 and metrics["reward/mean"] == metrics["reward/mean"]  # finite: not nan
    assert metrics["actor/grad_norm_nonfinite"] == 0.0 and metrics["actor/grad_norm"] > 0.0
