"""Config: YAML + dotted overrides, unknown keys named with the nearest valid one, descriptions everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel
from tiny_run import CONFIG

from rlloom.core_rl.config.loading import config_from_dict, load_config
from rlloom.core_rl.config.schema import ConfigError, RLConfig


def test_yaml_and_overrides() -> None:
    cfg = load_config(CONFIG, ["model.path=/m", "trainer.output_dir=/o", "actor.lr=1e-5", "trainer.trackers=[jsonl]"])
    assert cfg.model.path == "/m"
    assert cfg.actor.lr == 1e-5
    assert cfg.actor.mini_batch_size == 3  # from the YAML
    assert cfg.trainer.trackers == ["jsonl"]
    assert cfg.algorithm.policy_loss.clip_high == 0.28
    # the resolved config round-trips through its YAML dump
    assert config_from_dict(__import__("yaml").safe_load(cfg.to_yaml())) == cfg


def test_small_run_config_fits_in_about_40_lines() -> None:
    lines = [ln for ln in CONFIG.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) <= 40


def test_unknown_key_names_the_nearest_valid_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'actor.lr_warmup_step'.*did you mean 'actor.warmup_steps'"):
        load_config(None, ["model.path=/m", "actor.lr_warmup_step=3"])
    with pytest.raises(ConfigError, match=r"unknown key 'trainr'.*did you mean 'trainer'"):
        config_from_dict({"model": {"path": "/m"}, "trainr": {}})


def test_bad_values_and_names_are_errors() -> None:
    with pytest.raises(ConfigError, match=r"^algorithm.policy_loss.clip_low: input should be less than 1 \(got 1.5\)$"):
        load_config(None, ["model.path=/m", "algorithm.policy_loss.clip_low=1.5"])
    with pytest.raises(
        ConfigError, match="^algorithm.advantage.estimator: unknown advantage estimator 'grpoo'; did you mean"
    ):
        load_config(None, ["model.path=/m", "algorithm.advantage.estimator=grpoo"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["model.path"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, ["model.path=/m", "model.path.x=1"])
    with pytest.raises(ConfigError, match=r"^data.filter_overlong_prompts: set but data.max_prompt_length is not"):
        load_config(None, ["model.path=/m", "data.filter_overlong_prompts=true"])


def test_every_field_has_a_description() -> None:
    def walk(model: type[BaseModel], prefix: str) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                missing += walk(ann, f"{prefix}{name}.")
            elif not field.description:
                missing.append(prefix + name)
        return missing

    assert walk(RLConfig, "") == []


def test_config_saved_in_output_dir(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tiny_run import run

    run(
        tiny_model_dir, tmp_path / "o", ["trainer.total_steps=1", "actor.warmup_steps=0", "algorithm.kl.use_loss=false"]
    )
    saved = load_config(tmp_path / "o" / "config.yaml")
    assert saved.trainer.total_steps == 1 and saved.model.path == str(tiny_model_dir)
