"""docs/config_names.md is the generator's output (regenerate: python -m rlloom.core_rl.config.compat.names_doc
docs/config_names.md), and every rlloom key it names as an alias target exists; TRL names get a hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlloom.core_rl.config.compat.names_doc import render
from rlloom.core_rl.config.compat.verl_aliases import VERL_ALIASES
from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError, RLConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "config_names.md"


def test_committed_table_equals_the_generated_one() -> None:
    if not DOC.is_file():
        pytest.skip("docs/ is not beside this package (an installed wheel)")
    assert DOC.read_text() == render(), (
        "regenerate: python -m rlloom.core_rl.config.compat.names_doc docs/config_names.md"
    )


@pytest.mark.parametrize("target", sorted({t for a in VERL_ALIASES.values() for t in a.targets}))
def test_every_alias_target_is_a_key(target: str) -> None:
    node: object = RLConfig
    for part in target.split("."):
        fields = getattr(node, "model_fields", None)
        assert fields is not None and part in fields, f"{target}: no field {part!r}"
        annotation = fields[part].annotation
        node = next((a for a in (annotation, *getattr(annotation, "__args__", ())) if hasattr(a, "model_fields")), None)


def test_trl_names_are_refused_with_ours_named() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'learning_rate'; that is TRL's GRPOConfig name; here it is "
        r"actor.lr\.",
    ):
        load_config(None, ["model.path=/m", "learning_rate=1e-6"])
    with pytest.raises(ConfigError, match="TRL's GRPOConfig name; here it is rollout.n"):
        load_config(None, ["model.path=/m", "num_generations=8"])
