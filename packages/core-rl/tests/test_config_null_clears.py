"""`key=null` on the command line clears what the YAML file set (issue 29): a field that takes None gets None
(an optional section is off), any other field gets its default back."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError

FILE = """model:
  path: /m
rollout:
  top_k: 5
  stop: ["</answer>"]
data:
  apply_chat_template_kwargs: {enable_thinking: false}
algorithm:
  tis: {cap: 2.0}
  entropy: {coef: 0.01}
trainer:
  total_steps: 9
"""


@pytest.fixture
def yaml_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(FILE)
    return path


def test_null_restores_the_default_of_a_field_that_cannot_be_null(yaml_file: Path) -> None:
    base = load_config(yaml_file)
    assert (base.rollout.top_k, base.rollout.stop, base.algorithm.entropy.coef) == (5, ["</answer>"], 0.01)
    cleared = load_config(
        yaml_file,
        ["rollout.top_k=null", "rollout.stop=null", "data.apply_chat_template_kwargs=null", "algorithm.entropy=null"],
    )
    assert cleared.rollout.top_k == 0
    assert cleared.rollout.stop == []
    assert cleared.data.apply_chat_template_kwargs == {}
    assert cleared.algorithm.entropy.coef == 0.0


def test_null_turns_an_optional_section_off_and_unsets_an_optional_value(yaml_file: Path) -> None:
    cleared = load_config(yaml_file, ["algorithm.tis=null", "trainer.total_steps=null"])
    assert cleared.algorithm.tis is None
    assert cleared.trainer.total_steps is None


def test_null_on_a_required_key_is_still_an_error(yaml_file: Path) -> None:
    with pytest.raises(ConfigError, match="model.path"):
        load_config(yaml_file, ["model.path=null"])
