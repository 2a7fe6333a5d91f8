"""What `vlm-geo3k train` checks before torch loads: the config and its `vision:` section, the data files, and the
`data_source` of every row (each must name a scorer), so a typo answers in about a second instead of after torch,
transformers and the model have loaded (issue 41). Imports nothing heavy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlloom_apps.vlm_geo3k.settings import VisionSettings, load_train_config

from rlloom.core_rl.config import RLConfig, bundled_config
from rlloom.core_rl.data import check_row_sources
from rlloom.rewards import DEFAULT_SCORERS, registry

CONFIGS = Path(__file__).parent / "configs"
ALGORITHMS = ("grpo",)
SCORERS = {"geometry3k": "geo3k_easyr1"}  # EasyR1's math reward rather than the registry's plain accuracy


def config_file(name: str) -> Path:
    """A bundled config by algorithm name, or a YAML path."""
    return bundled_config(name, CONFIGS, ALGORITHMS)


def load_config(name: str, overrides: Sequence[str] = ()) -> tuple[RLConfig, VisionSettings]:
    """The config and its `vision:` section, overrides applied and validated before anything loads."""
    return load_train_config(config_file(name), overrides)


def _known(name: str) -> bool:
    return name in SCORERS or registry.canonical_source(name) is not None or ":" in name


def check_rows(train_data: Path, val_data: Path | None) -> None:
    """Every row file holds rows, and each row's `data_source` names a scorer; a `ConfigError` listing every
    problem (file:line, the name, the nearest known one) otherwise."""
    check_row_sources(
        {"--train-data": train_data, "--val-data": val_data},
        known=_known,
        valid=DEFAULT_SCORERS,
        prepare_command="vlm-geo3k prepare-data",
    )


__all__ = ["ALGORITHMS", "CONFIGS", "SCORERS", "check_rows", "config_file", "load_config"]
