"""What `reasoning train` checks before torch loads: the config (keys, types, names), the data files and the
`data_source` of every row (each must name a scorer of `rlloom.rewards`), so that a typo answers in about a second
instead of after torch, transformers and the model have loaded (issue 41). Imports nothing heavy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rlloom_apps.reasoning.bundled import ALGORITHMS, CONFIGS

from rlloom.core_rl.config import RLConfig, bundled_config, load_config
from rlloom.core_rl.data import check_row_sources
from rlloom.rewards import DEFAULT_SCORERS, registry


def config_file(name: str) -> Path:
    """A bundled config by algorithm name, or a YAML path."""
    return bundled_config(name, CONFIGS, ALGORITHMS)


def load_train_config(name: str, overrides: Sequence[str] = ()) -> RLConfig:
    """The config with the user's dotted overrides applied and validated (a bad key fails before any loading)."""
    return load_config(config_file(name), overrides)


def known_source(name: str, scorers: Mapping[str, str] | None = None) -> bool:
    """Whether a row's `data_source` names a scorer: a registry name (`openai/gsm8k`, `math500`, ...), a
    `module:function` spec, or a key of `scorers` (the app's own mapping)."""
    return name in (scorers or {}) or registry.canonical_source(name) is not None or ":" in name


def check_rows(train_data: Path | None, val_data: Path | None = None, files: Mapping[str, Path] | None = None) -> None:
    """Every row file holds rows, and each row's `data_source` names a scorer; a `ConfigError` listing every
    problem (file:line, the name, the nearest known one) otherwise. `files` (how the user named it -> path, e.g.
    `data.train_files[1]`) replaces the two flags when given."""
    check_row_sources(
        dict(files) if files is not None else {"--train-data": train_data, "--val-data": val_data},
        known=known_source,
        valid=DEFAULT_SCORERS,
        prepare_command="reasoning prepare-data",
        unknown_hint=" (a name of rlloom.rewards' registry or 'module:function')",
    )


__all__ = ["check_rows", "config_file", "known_source", "load_train_config"]
