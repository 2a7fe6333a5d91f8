"""One load reports every configuration error at once, one line each (issue 29): unknown keys in the file and in
the overrides, malformed overrides, and pydantic's value errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from rlloom.core_rl.config.loading import load_config, load_config_with_section
from rlloom.core_rl.config.schema import ConfigError


def _error(path: Path | None, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    return str(caught.value).splitlines()


def test_unknown_keys_bad_overrides_and_bad_values_come_in_one_error(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model:\n  path: /m\nactor:\n  lrr: 1\nrollout:\n  tempreature: 1.0\n")
    lines = _error(
        yaml_file,
        ["trainer.total_stesp=3", "rollout.n=0", "notkeyvalue", "+trainer.x=1", "actor.ppo_epochs=0"],
    )
    assert len(lines) == 7, lines
    assert lines[0].startswith(f"{yaml_file}: unknown key 'actor.lrr'")
    assert lines[1].startswith(f"{yaml_file}: unknown key 'rollout.tempreature'")
    assert lines[2].startswith("command-line override 'trainer.total_stesp=3': unknown key 'trainer.total_stesp'")
    assert lines[3].startswith("override 'notkeyvalue' is not key=value")
    assert lines[4].startswith("command-line override '+trainer.x=1': the leading '+' is Hydra syntax")
    assert sorted(lines[5:]) == [
        "actor.ppo_epochs: input should be greater than or equal to 1 (got 0)",
        "rollout.n: input should be greater than or equal to 1 (got 0)",
    ]


def test_a_single_error_is_still_one_line() -> None:
    assert _error(None, ["model.path=/m", "rollout.n=0"]) == [
        "rollout.n: input should be greater than or equal to 1 (got 0)"
    ]


class _App(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: int = 3


def test_the_app_section_errors_join_the_others(tmp_path: Path) -> None:
    yaml_file = tmp_path / "app.yaml"
    yaml_file.write_text("model:\n  path: /m\napp:\n  top_k: 3\n")
    with pytest.raises(ConfigError) as caught:
        load_config_with_section(yaml_file, "app", _App, ["app.topk=1", "app.top_k=x", "rollout.n=0"])
    lines = str(caught.value).splitlines()
    assert len(lines) == 3, lines
    assert "unknown key 'app.topk'" in lines[0]
    assert lines[1].startswith("app.top_k: input should be a valid integer")
    assert lines[2].startswith("rollout.n: input should be greater than or equal to 1")
